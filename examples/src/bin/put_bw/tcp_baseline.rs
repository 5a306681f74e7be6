//! The Ethernet baseline: one plain TCP stream from rank 0 to rank 1, on the address the
//! Ethernet transport listens on (loopback between threads of one process, the address
//! the bootstrap reached between processes), with the socket settings it uses (no Nagle).

use oxccl::{Communicator, Error, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Out-of-band tag of rank 1's listener address (below the communicator's own tags).
const TAG_ADDRESS: u64 = 0x7075_745f_6277;

/// One end of the stream: rank 0 writes, rank 1 reads.
pub(crate) struct TcpStreamPair {
    stream: TcpStream,
    rank: u32,
    /// What is written, or where it is read into.
    buf: Vec<u8>,
}

impl TcpStreamPair {
    /// Rank 1 listens and sends its address and a token to rank 0; rank 0 connects and
    /// sends the token first, so rank 1 knows the stream is rank 0's.
    ///
    /// # Errors
    /// A socket or the out-of-band exchange failed, or no one connected by `timeout`.
    pub(crate) fn connect(comm: &Communicator, timeout: Duration) -> Result<Self> {
        let oob = comm.out_of_band();
        let rank = comm.rank();
        let token = oxccl_bootstrap::Secret::random()?.to_hex();
        let stream = if rank == 1 {
            let ip = oob.local_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
            let listener = TcpListener::bind((ip, 0))
                .map_err(|e| system(&format!("binding the baseline's listener on {ip}"), e))?;
            let addr = listener
                .local_addr()
                .map_err(|e| system("reading the baseline listener's address", e))?;
            oob.send(0, TAG_ADDRESS, format!("{addr} {token}").into_bytes())?;
            let stream = accept_until(&listener, Instant::now() + timeout)?;
            set_up(&stream, timeout)?;
            let mut got = vec![0u8; token.len()];
            (&stream)
                .read_exact(&mut got)
                .map_err(|e| system("reading the baseline's token", e))?;
            if got != token.as_bytes() {
                return Err(Error::InvalidUsage(
                    "the baseline's listener was reached by someone other than rank 0".into(),
                ));
            }
            stream
        } else {
            let message = oob.recv(1, TAG_ADDRESS)?;
            let text = String::from_utf8_lossy(&message);
            let parsed = text.split_once(' ').and_then(|(addr, token)| {
                Some((addr.parse::<SocketAddr>().ok()?, token.to_owned()))
            });
            let Some((addr, token)) = parsed else {
                return Err(Error::InvalidUsage(format!(
                    "rank 1 sent a baseline address that cannot be read: {text:?}"
                )));
            };
            let stream = TcpStream::connect_timeout(&addr, timeout)
                .map_err(|e| system(&format!("connecting the baseline's stream to {addr}"), e))?;
            set_up(&stream, timeout)?;
            (&stream)
                .write_all(token.as_bytes())
                .map_err(|e| system("sending the baseline's token", e))?;
            stream
        };
        Ok(TcpStreamPair {
            stream,
            rank,
            buf: Vec::new(),
        })
    }

    /// The best of `runs` timed runs (rank 0's clock), each streaming `bytes` `iters` times
    /// and waiting for a one-byte acknowledgement. Both ranks call it.
    ///
    /// # Errors
    /// The stream or a barrier failed, or the peer closed the stream.
    pub(crate) fn best_of(
        &mut self,
        comm: &Communicator,
        bytes: u64,
        iters: u32,
        runs: u32,
    ) -> Result<Duration> {
        let n = bytes as usize;
        if self.buf.len() < n {
            self.buf.resize(n, 0x5a);
        }
        let mut best = Duration::MAX;
        // One untimed run, as for the channel.
        for run in 0..=runs.max(1) {
            comm.barrier()?;
            let start = Instant::now();
            if self.rank == 0 {
                for _ in 0..iters {
                    self.stream
                        .write_all(&self.buf[..n])
                        .map_err(|e| system("writing the baseline's stream", e))?;
                }
                let mut ack = [0u8; 1];
                self.stream
                    .read_exact(&mut ack)
                    .map_err(|e| system("reading the baseline's acknowledgement", e))?;
            } else {
                let mut left = bytes * u64::from(iters);
                while left > 0 {
                    let chunk = (left.min(self.buf.len() as u64)) as usize;
                    let got = self
                        .stream
                        .read(&mut self.buf[..chunk])
                        .map_err(|e| system("reading the baseline's stream", e))?;
                    if got == 0 {
                        return Err(Error::InvalidUsage(
                            "rank 0 closed the baseline's stream early".into(),
                        ));
                    }
                    left -= got as u64;
                }
                self.stream
                    .write_all(&[1])
                    .map_err(|e| system("acknowledging the baseline's stream", e))?;
            }
            if run > 0 {
                best = best.min(start.elapsed());
            }
        }
        Ok(best)
    }
}

/// Accepts one connection, polling until `deadline`.
fn accept_until(listener: &TcpListener, deadline: Instant) -> Result<TcpStream> {
    listener
        .set_nonblocking(true)
        .map_err(|e| system("setting the baseline's listener non-blocking", e))?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(|e| system("setting the baseline's stream blocking", e))?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::InvalidUsage(
                        "rank 0 did not connect the baseline's stream in time".into(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(system("accepting the baseline's stream", e)),
        }
    }
}

/// No Nagle (as the transport's sockets), and reads and writes bounded by `timeout`.
fn set_up(stream: &TcpStream, timeout: Duration) -> Result<()> {
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(timeout)))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| system("setting up the baseline's stream", e))
}

fn system(context: &str, source: std::io::Error) -> Error {
    Error::System {
        context: context.into(),
        source,
    }
}
