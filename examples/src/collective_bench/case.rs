//! One call of a collective on one rank: its buffers, their contents before the call, the
//! call itself, and the part of the output every rank can predict exactly.
//!
//! Inputs are small integers ([`value`]), exact in every type. The reference combines the
//! ranks' values in rank order with [`ReduceElement::combine`] and
//! [`ReduceElement::finish`], as the kernels do, so a correct result is bitwise equal to it,
//! floating point included. Outputs start filled with [`SENTINEL`] bytes, so an element the
//! call never wrote is counted wrong.

use super::collective::{Collective, alltoallv_count};
use oxccl::{Communicator, DataType, DeviceBuffer, ReduceElement, ReduceOp, Result, Stream};

/// The byte every output element is filled with before a checked call.
pub const SENTINEL: u8 = 0xa5;

/// Rank `rank`'s input element `i` in calls of seed `seed`: a small integer (between -9
/// and 13 for signed and floating-point types, 1 and 23 for unsigned ones), never the same
/// in two neighbouring elements or ranks. The MPI baseline uses the same values (seed 0).
pub fn value<T: ReduceElement>(rank: u32, i: usize, seed: u32) -> T {
    let v = ((rank as usize * 7 + i * 13 + seed as usize * 5) % 23) as f64;
    let unsigned = matches!(T::TYPE, DataType::U8 | DataType::U32 | DataType::U64);
    T::from_f64(if unsigned { v + 1.0 } else { v - 9.0 })
}

/// The reduction by `op` of every rank's `elem(rank)`, combined in rank order.
pub fn reduced<T: ReduceElement>(ranks: u32, op: ReduceOp, elem: impl Fn(u32) -> T) -> T {
    let mut acc = elem(0);
    for r in 1..ranks {
        acc = acc.combine(elem(r), op);
    }
    acc.finish(op, ranks)
}

/// The element every byte of which is [`SENTINEL`].
pub fn sentinel<T: ReduceElement>() -> T {
    let mut t = T::zeroed();
    bytemuck::bytes_of_mut(&mut t).fill(SENTINEL);
    t
}

/// Elements of `got` that differ bitwise from `want`.
pub fn count_wrong<T: ReduceElement>(got: &[T], want: &[T]) -> u64 {
    let differ = got
        .iter()
        .zip(want)
        .filter(|(g, w)| bytemuck::bytes_of(*g) != bytemuck::bytes_of(*w))
        .count();
    (differ + got.len().abs_diff(want.len())) as u64
}

/// One call: which collective, its count, who calls it, and with what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    /// The collective.
    pub collective: Collective,
    /// The call's `count` (for all-to-all-v, the `count` of [`alltoallv_count`]).
    pub count: usize,
    /// This rank.
    pub rank: u32,
    /// Ranks of the communicator.
    pub ranks: u32,
    /// Reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Root (ignored by collectives without one).
    pub root: u32,
    /// Varies the inputs from call to call.
    pub seed: u32,
    /// In place: one buffer is the input and the output.
    pub in_place: bool,
}

/// A case's reference: `values` are the output elements from `offset` on.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected<T> {
    /// First element of the output buffer that is checked.
    pub offset: usize,
    /// What they must hold.
    pub values: Vec<T>,
}

/// A case's buffers: the input, and the output when not in place.
pub struct Buffers<T: ReduceElement> {
    /// The send buffer, or the only buffer in place.
    pub input: DeviceBuffer<T>,
    /// The receive buffer (out of place only).
    pub output: Option<DeviceBuffer<T>>,
}

impl<T: ReduceElement> Buffers<T> {
    /// The buffer the call writes its result into.
    pub fn result(&self) -> &DeviceBuffer<T> {
        self.output.as_ref().unwrap_or(&self.input)
    }
}

impl Case {
    /// Elements this rank sends each rank in an all-to-all-v, and their displacements.
    fn v_sends(&self, from: u32) -> (Vec<usize>, Vec<usize>) {
        let counts: Vec<usize> = (0..self.ranks)
            .map(|to| alltoallv_count(from, to, self.count as u64) as usize)
            .collect();
        (displacements(&counts), counts)
    }

    /// Elements this rank receives from each rank in an all-to-all-v, and where they go.
    fn v_recvs(&self) -> (Vec<usize>, Vec<usize>) {
        let counts: Vec<usize> = (0..self.ranks)
            .map(|from| alltoallv_count(from, self.rank, self.count as u64) as usize)
            .collect();
        (displacements(&counts), counts)
    }

    /// Elements of the input buffer (the only buffer in place).
    pub fn input_len(&self) -> usize {
        let (n, c) = (self.ranks as usize, self.count);
        match self.collective {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => c,
            Collective::AllGather if !self.in_place => c,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => c * n,
            Collective::AllToAllV => self.v_sends(self.rank).1.iter().sum(),
        }
    }

    /// Elements of the output buffer (out of place).
    pub fn output_len(&self) -> usize {
        let (n, c) = (self.ranks as usize, self.count);
        match self.collective {
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::ReduceScatter => c,
            Collective::AllGather | Collective::AllToAll => c * n,
            Collective::AllToAllV => self.v_recvs().1.iter().sum(),
        }
    }

    /// The input buffer's contents before the call.
    pub fn input<T: ReduceElement>(&self) -> Vec<T> {
        let (rank, seed) = (self.rank, self.seed);
        match self.collective {
            Collective::AllGather if self.in_place => {
                // Only this rank's block is input; the rest is output.
                let c = self.count;
                (0..self.input_len())
                    .map(|i| {
                        if i / c.max(1) == rank as usize {
                            value(rank, i - rank as usize * c, seed)
                        } else {
                            sentinel()
                        }
                    })
                    .collect()
            }
            Collective::Broadcast if self.in_place && rank != self.root => {
                vec![sentinel(); self.input_len()]
            }
            _ => (0..self.input_len())
                .map(|i| value(rank, i, seed))
                .collect(),
        }
    }

    /// What the output must hold after the call on this rank, or `None` where nothing is
    /// defined (a reduce's output off the root).
    pub fn expected<T: ReduceElement>(&self) -> Option<Expected<T>> {
        let (rank, n, c, seed) = (self.rank, self.ranks, self.count, self.seed);
        let all_ranks = |i: usize| reduced(n, self.op, |r| value::<T>(r, i, seed));
        let (offset, values): (usize, Vec<T>) = match self.collective {
            Collective::AllReduce => (0, (0..c).map(all_ranks).collect()),
            Collective::Reduce if rank != self.root => return None,
            Collective::Reduce => (0, (0..c).map(all_ranks).collect()),
            Collective::Broadcast => (0, (0..c).map(|i| value(self.root, i, seed)).collect()),
            Collective::AllGather => (
                0,
                (0..n)
                    .flat_map(|r| (0..c).map(move |i| value(r, i, seed)))
                    .collect(),
            ),
            Collective::ReduceScatter => {
                let first = rank as usize * c;
                let values = (first..first + c).map(all_ranks).collect();
                (if self.in_place { first } else { 0 }, values)
            }
            Collective::AllToAll => (
                0,
                (0..n)
                    .flat_map(|r| (0..c).map(move |i| value(r, rank as usize * c + i, seed)))
                    .collect(),
            ),
            Collective::AllToAllV => (
                0,
                (0..n)
                    .flat_map(|from| {
                        let (displs, counts) = self.v_sends(from);
                        let (start, len) = (displs[rank as usize], counts[rank as usize]);
                        (start..start + len).map(move |i| value(from, i, seed))
                    })
                    .collect(),
            ),
        };
        Some(Expected { offset, values })
    }

    /// Allocates the case's buffers (contents unset: see [`Self::reset`]).
    ///
    /// # Errors
    /// A failed allocation.
    pub fn alloc<T: ReduceElement>(&self, comm: &Communicator) -> Result<Buffers<T>> {
        // One element at least: a zero-length allocation says nothing of the call.
        let input = comm.alloc::<T>(self.input_len().max(1))?;
        let output = if self.in_place {
            None
        } else {
            Some(comm.alloc::<T>(self.output_len().max(1))?)
        };
        Ok(Buffers { input, output })
    }

    /// Sets the buffers as the call expects them: `input` (from [`Self::input`]) into the
    /// input buffer, sentinels into the output.
    ///
    /// # Errors
    /// A failed copy.
    pub fn reset<T: ReduceElement>(&self, bufs: &mut Buffers<T>, input: &[T]) -> Result<()> {
        let mut host = vec![sentinel::<T>(); bufs.input.len()];
        host[..input.len()].copy_from_slice(input);
        bufs.input.copy_from_host(&host)?;
        if let Some(out) = bufs.output.as_mut() {
            out.fill(sentinel())?;
        }
        Ok(())
    }

    /// Elements of the result that differ from `want` (`None`: nothing to check).
    ///
    /// # Errors
    /// A failed copy.
    pub fn wrong<T: ReduceElement>(
        &self,
        bufs: &Buffers<T>,
        want: Option<&Expected<T>>,
    ) -> Result<u64> {
        let Some(want) = want else { return Ok(0) };
        let got = bufs.result().to_vec()?;
        let end = (want.offset + want.values.len()).min(got.len());
        Ok(count_wrong(&got[want.offset.min(end)..end], &want.values))
    }

    /// Enqueues the call on `stream`.
    ///
    /// # Errors
    /// What the collective returns.
    pub fn call<T: ReduceElement>(
        &self,
        comm: &mut Communicator,
        bufs: &mut Buffers<T>,
        stream: &Stream,
    ) -> Result<()> {
        let (c, op, root) = (self.count, self.op, self.root);
        let Buffers { input, output } = bufs;
        match (self.collective, output.as_mut()) {
            (Collective::AllReduce, Some(out)) => comm.all_reduce(input, out, c, op, stream),
            (Collective::AllReduce, None) => comm.all_reduce_in_place(input, c, op, stream),
            (Collective::AllGather, Some(out)) => comm.all_gather(input, out, c, stream),
            (Collective::AllGather, None) => comm.all_gather_in_place(input, c, stream),
            (Collective::ReduceScatter, Some(out)) => {
                comm.reduce_scatter(input, out, c, op, stream)
            }
            (Collective::ReduceScatter, None) => comm.reduce_scatter_in_place(input, c, op, stream),
            (Collective::Broadcast, Some(out)) => comm.broadcast(input, out, c, root, stream),
            (Collective::Broadcast, None) => comm.broadcast_in_place(input, c, root, stream),
            (Collective::Reduce, Some(out)) => comm.reduce(input, out, c, op, root, stream),
            (Collective::Reduce, None) => comm.reduce_in_place(input, c, op, root, stream),
            (Collective::AllToAll, Some(out)) => comm.all_to_all(input, out, c, stream),
            (Collective::AllToAll, None) => comm.all_to_all_in_place(input, c, stream),
            (Collective::AllToAllV, Some(out)) => {
                let (send_displs, send_counts) = self.v_sends(self.rank);
                let (recv_displs, recv_counts) = self.v_recvs();
                comm.all_to_allv(
                    input,
                    &send_counts,
                    &send_displs,
                    out,
                    &recv_counts,
                    &recv_displs,
                    stream,
                )
            }
            (Collective::AllToAllV, None) => Err(oxccl::Error::InvalidUsage(
                "all_to_allv has no in-place form".into(),
            )),
        }
    }
}

/// Where each of `counts` starts when they are laid end to end.
fn displacements(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |next, &c| {
            let at = *next;
            *next += c;
            Some(at)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(collective: Collective, rank: u32, in_place: bool) -> Case {
        Case {
            collective,
            count: 4,
            rank,
            ranks: 2,
            op: ReduceOp::Sum,
            root: 1,
            seed: 0,
            in_place,
        }
    }

    /// Guards against a reference that places a rank's block at the wrong offset or
    /// combines the wrong elements: the expected outputs of small cases written out.
    #[test]
    fn references_of_small_cases() {
        let v = |r, i| value::<i32>(r, i, 0);
        let ar = case(Collective::AllReduce, 0, false)
            .expected::<i32>()
            .unwrap();
        assert_eq!(
            ar.values,
            (0..4).map(|i| v(0, i) + v(1, i)).collect::<Vec<_>>()
        );
        let ag = case(Collective::AllGather, 1, true);
        assert_eq!(ag.input_len(), 8);
        let input = ag.input::<i32>();
        assert_eq!(input[4..], [v(1, 0), v(1, 1), v(1, 2), v(1, 3)]);
        assert_eq!(input[0], sentinel::<i32>());
        let rs = case(Collective::ReduceScatter, 1, true)
            .expected::<i32>()
            .unwrap();
        assert_eq!(rs.offset, 4);
        assert_eq!(
            rs.values,
            (4..8).map(|i| v(0, i) + v(1, i)).collect::<Vec<_>>()
        );
        assert_eq!(case(Collective::Reduce, 0, false).expected::<i32>(), None);
        let a2a = case(Collective::AllToAll, 1, false)
            .expected::<i32>()
            .unwrap();
        assert_eq!(
            a2a.values,
            [
                v(0, 4),
                v(0, 5),
                v(0, 6),
                v(0, 7),
                v(1, 4),
                v(1, 5),
                v(1, 6),
                v(1, 7)
            ]
        );
        // All-to-all-v of 4: rank 0 sends itself 2 and rank 1 six; rank 1 sends rank 0 six.
        let a2av = case(Collective::AllToAllV, 1, false);
        assert_eq!((a2av.input_len(), a2av.output_len()), (8, 8));
        let want = a2av.expected::<i32>().unwrap().values;
        let from0: Vec<i32> = (2..8).map(|i| v(0, i)).collect();
        assert_eq!(want[..6], from0[..]);
        assert_eq!(want[6..], [v(1, 6), v(1, 7)]);
    }

    /// Guards against a check that misses an unwritten element, or counts a right one.
    #[test]
    fn wrong_elements_are_counted_bitwise() {
        assert_eq!(
            count_wrong(&[1.0f32, -0.0, f32::NAN], &[1.0, 0.0, f32::NAN]),
            1
        );
        assert_eq!(count_wrong::<u8>(&[1, 2], &[1, 2, 3]), 1);
        assert_eq!(sentinel::<u8>(), SENTINEL);
    }
}
