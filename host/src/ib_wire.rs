//! What two ranks send each other to connect over InfiniBand / RoCE: the address of each
//! end's queue pair ([`IbEndpoint`]). A registered memory carries its own remote key
//! ([`RegisteredMemory::ib_rkey`](crate::RegisteredMemory::ib_rkey)).
//!
//! On the wire an endpoint is [`IB_WIRE_VERSION`] then the fields (postcard), at most
//! [`MAX_ENDPOINT_BYTES`]. What a peer sends is checked on arrival, before any queue pair is
//! touched: a queue pair number or packet sequence number wider than the 24 bits verbs use
//! (or a special queue pair, 0 or 1), an MTU that is none of the five InfiniBand sizes, a
//! route with neither a LID (InfiniBand) nor a GID (RoCE, or a global route) is refused with
//! an error saying which. Compiled with or without the `ib` feature, so these checks are
//! tested everywhere.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Version of the endpoint encoding; a peer with another is refused.
pub const IB_WIRE_VERSION: u32 = 1;

/// Longest encoded endpoint a peer may send.
pub const MAX_ENDPOINT_BYTES: usize = 64;

/// Largest queue pair number or packet sequence number (24 bits).
pub const MAX_24_BIT: u32 = 0x00ff_ffff;

/// Path MTUs an InfiniBand port may use, in bytes.
pub const MTUS: [u16; 5] = [256, 512, 1024, 2048, 4096];

/// First multicast LID: unicast LIDs are 1..0xc000.
const MULTICAST_LID: u16 = 0xc000;

/// One end of a reliable-connected queue pair, as its peer needs it to connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IbEndpoint {
    /// The queue pair's number (24 bits).
    pub qp_number: u32,
    /// The first packet sequence number this end sends (24 bits); the peer expects it.
    pub psn: u32,
    /// The port's LID (InfiniBand); 0 on RoCE.
    pub lid: u16,
    /// The port's GID at the chosen index.
    pub gid: [u8; 16],
    /// Whether packets to this end need a global route header (RoCE always; InfiniBand
    /// across subnets): the peer then addresses it by `gid`, else by `lid`.
    pub global: bool,
    /// The port's active MTU, in bytes: both ends use the smaller of theirs.
    pub mtu: u16,
}

impl IbEndpoint {
    /// Encodes for the out-of-band exchange.
    ///
    /// # Errors
    /// Never in practice; an encoder failure is reported as [`Error::Internal`].
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let encode = |e: postcard::Error| Error::Internal(format!("encoding an IB endpoint: {e}"));
        let mut out = postcard::to_stdvec(&IB_WIRE_VERSION).map_err(encode)?;
        out.extend(postcard::to_stdvec(self).map_err(encode)?);
        Ok(out)
    }

    /// Decodes and checks what a peer's [`Self::to_bytes`] produced.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for bytes that are not an endpoint of this version, or an
    /// endpoint no queue pair could connect to (see the module docs).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let malformed =
            |what: String| Error::InvalidUsage(format!("malformed IB endpoint: {what}"));
        if bytes.len() > MAX_ENDPOINT_BYTES {
            return Err(malformed(format!(
                "{} bytes, more than the {MAX_ENDPOINT_BYTES} an endpoint takes",
                bytes.len()
            )));
        }
        let (version, rest) =
            postcard::take_from_bytes::<u32>(bytes).map_err(|e| malformed(e.to_string()))?;
        if version != IB_WIRE_VERSION {
            return Err(malformed(format!(
                "version {version}, this build speaks {IB_WIRE_VERSION}: every rank of a job \
                 must run the same oxccl"
            )));
        }
        let (endpoint, rest) =
            postcard::take_from_bytes::<IbEndpoint>(rest).map_err(|e| malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(malformed(format!("{} bytes after it", rest.len())));
        }
        endpoint.check().map_err(malformed)?;
        Ok(endpoint)
    }

    /// Why no queue pair could connect to this endpoint, if none could.
    ///
    /// # Errors
    /// What is wrong, in words.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.qp_number <= 1 || self.qp_number > MAX_24_BIT {
            return Err(format!(
                "queue pair number {:#x} is not that of a connected queue pair (2..=0xffffff)",
                self.qp_number
            ));
        }
        if self.psn > MAX_24_BIT {
            return Err(format!(
                "packet sequence number {:#x} is wider than 24 bits",
                self.psn
            ));
        }
        if !MTUS.contains(&self.mtu) {
            return Err(format!("MTU {} is none of {MTUS:?} bytes", self.mtu));
        }
        if self.global && self.gid == [0; 16] {
            return Err("a global route with a zero GID".into());
        }
        if !self.global && (self.lid == 0 || self.lid >= MULTICAST_LID) {
            return Err(format!(
                "a local route with LID {:#x}, which is no unicast LID (1..0xc000)",
                self.lid
            ));
        }
        Ok(())
    }

    /// The MTU both ends of a connection between `self` and `peer` use: the smaller.
    pub fn path_mtu(&self, peer: &IbEndpoint) -> u16 {
        self.mtu.min(peer.mtu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roce() -> IbEndpoint {
        IbEndpoint {
            qp_number: 0x1234,
            psn: 0xabcdef,
            lid: 0,
            gid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
            ],
            global: true,
            mtu: 1024,
        }
    }

    fn infiniband() -> IbEndpoint {
        IbEndpoint {
            lid: 7,
            global: false,
            mtu: 4096,
            ..roce()
        }
    }

    /// Guards against an endpoint that does not survive the trip to the peer.
    #[test]
    fn endpoints_round_trip() {
        for endpoint in [roce(), infiniband()] {
            let bytes = endpoint.to_bytes().unwrap();
            assert!(bytes.len() <= MAX_ENDPOINT_BYTES);
            assert_eq!(IbEndpoint::from_bytes(&bytes).unwrap(), endpoint);
        }
        assert_eq!(roce().path_mtu(&infiniband()), 1024);
    }

    /// Guards against a peer's endpoint that verbs would misread (a field cut to 24 bits,
    /// an MTU code out of range) or that routes nowhere being handed to `ibv_modify_qp`.
    #[test]
    fn endpoints_no_queue_pair_could_reach_are_refused() {
        let cases: [(&str, IbEndpoint); 8] = [
            (
                "queue pair number",
                IbEndpoint {
                    qp_number: 1,
                    ..roce()
                },
            ),
            (
                "queue pair number",
                IbEndpoint {
                    qp_number: MAX_24_BIT + 1,
                    ..roce()
                },
            ),
            (
                "packet sequence",
                IbEndpoint {
                    psn: MAX_24_BIT + 1,
                    ..roce()
                },
            ),
            (
                "MTU",
                IbEndpoint {
                    mtu: 1500,
                    ..roce()
                },
            ),
            ("MTU", IbEndpoint { mtu: 0, ..roce() }),
            (
                "zero GID",
                IbEndpoint {
                    gid: [0; 16],
                    ..roce()
                },
            ),
            (
                "LID",
                IbEndpoint {
                    lid: 0,
                    ..infiniband()
                },
            ),
            (
                "LID",
                IbEndpoint {
                    lid: 0xc001,
                    ..infiniband()
                },
            ),
        ];
        for (what, endpoint) in cases {
            let err = IbEndpoint::from_bytes(&endpoint.to_bytes().unwrap()).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidUsage(m) if m.contains(what)),
                "{endpoint:?}: {err}"
            );
        }
    }

    /// Guards against garbage, a cut or padded frame, or another version being taken for
    /// an endpoint, and against a panic on any of them.
    #[test]
    fn malformed_endpoints_are_refused_without_panicking() {
        let good = infiniband().to_bytes().unwrap();
        for len in 0..good.len() {
            assert!(
                IbEndpoint::from_bytes(&good[..len]).is_err(),
                "cut to {len}"
            );
        }
        let mut padded = good.clone();
        padded.push(0);
        assert!(IbEndpoint::from_bytes(&padded).is_err());
        let mut other_version = postcard::to_stdvec(&(IB_WIRE_VERSION + 1)).unwrap();
        other_version.extend_from_slice(&good[1..]);
        let err = IbEndpoint::from_bytes(&other_version).unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
        assert!(IbEndpoint::from_bytes(&[0xff; MAX_ENDPOINT_BYTES + 1]).is_err());
        // Every single-bit corruption decodes to a checked endpoint or an error.
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut bent = good.clone();
                bent[byte] ^= 1 << bit;
                if let Ok(endpoint) = IbEndpoint::from_bytes(&bent) {
                    assert_eq!(endpoint.check(), Ok(()));
                }
            }
        }
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn arb_endpoint() -> impl Strategy<Value = IbEndpoint> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<u16>(),
            any::<[u8; 16]>(),
            any::<bool>(),
            prop_oneof![proptest::sample::select(MTUS.to_vec()), any::<u16>()],
        )
            .prop_map(|(qp_number, psn, lid, gid, global, mtu)| IbEndpoint {
                qp_number,
                psn,
                lid,
                gid,
                global,
                mtu,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Guards against an endpoint that fits no message of [`MAX_ENDPOINT_BYTES`], and
        /// against one being accepted that no queue pair could connect to, or refused when
        /// one could.
        #[test]
        fn endpoints_arrive_exactly_when_they_check(endpoint in arb_endpoint()) {
            let bytes = endpoint.to_bytes().unwrap();
            prop_assert!(bytes.len() <= MAX_ENDPOINT_BYTES, "{} bytes", bytes.len());
            match IbEndpoint::from_bytes(&bytes) {
                Ok(back) => {
                    prop_assert_eq!(back, endpoint);
                    prop_assert_eq!(endpoint.check(), Ok(()));
                }
                Err(_) => prop_assert!(endpoint.check().is_err()),
            }
        }

        /// Guards against a panic on any bytes a peer sends, or an endpoint decoded from
        /// them that fails the checks. Every prefix is tried: an endpoint must use all the
        /// bytes, which random bytes of one length rarely do.
        #[test]
        fn arbitrary_bytes_are_an_error_or_a_checked_endpoint(
            versioned in any::<bool>(),
            body in vec(any::<u8>(), 0..MAX_ENDPOINT_BYTES + 8),
        ) {
            let mut bytes = if versioned {
                postcard::to_stdvec(&IB_WIRE_VERSION).unwrap()
            } else {
                Vec::new()
            };
            bytes.extend_from_slice(&body);
            for len in 0..=bytes.len() {
                if let Ok(endpoint) = IbEndpoint::from_bytes(&bytes[..len]) {
                    prop_assert_eq!(endpoint.check(), Ok(()));
                    // Not equal: postcard also reads over-long varints.
                    prop_assert!(endpoint.to_bytes().unwrap().len() <= len);
                }
            }
        }
    }
}
