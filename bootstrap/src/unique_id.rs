//! `UniqueId`: where the root listens, and the secret every connection must prove.
//!
//! One process creates it ([`UniqueId::new`] or [`UniqueId::listen`]) and hands it to the
//! others out of band, usually as a string in `OXCCL_UNIQUE_ID`. The string form is
//! `oxccl1:<32 hex digits of secret>@<ip>:<port>` (IPv6 as `[addr]:port`). The secret is
//! 128 random bits from the OS; it never goes on the wire, only MACs computed with it do.
//! `Debug` output hides it, so logging a `UniqueId` does not leak it; `Display` is the
//! serialized form and does contain it.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::net::RootListener;

/// Prefix of the string form; the digit is the format version of the string.
pub const UNIQUE_ID_PREFIX: &str = "oxccl1:";

/// Length of the secret in bytes (128 bits).
pub const SECRET_BYTES: usize = 16;

/// The shared secret of one bootstrap. Compared only through MACs, never sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; SECRET_BYTES]);

impl Secret {
    /// A fresh secret from the operating system's random source.
    ///
    /// # Errors
    /// [`Error::System`] if the OS random source fails.
    pub fn random() -> Result<Self> {
        let mut bytes = [0u8; SECRET_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| {
            Error::system(
                "reading the OS random source",
                std::io::Error::other(e.to_string()),
            )
        })?;
        Ok(Secret(bytes))
    }

    /// A secret with the given bytes (e.g. one agreed out of band).
    pub const fn from_bytes(bytes: [u8; SECRET_BYTES]) -> Self {
        Secret(bytes)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; SECRET_BYTES] {
        &self.0
    }

    /// Parses 32 hex digits (the form `OXCCL_SECRET` and the `UniqueId` string use).
    ///
    /// # Errors
    /// [`ParseUniqueIdError::BadSecret`] if `s` is not exactly 32 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, ParseUniqueIdError> {
        let s = s.trim();
        if s.len() != 2 * SECRET_BYTES {
            return Err(ParseUniqueIdError::BadSecret(format!(
                "expected {} hex digits, found {} characters",
                2 * SECRET_BYTES,
                s.chars().count()
            )));
        }
        let mut bytes = [0u8; SECRET_BYTES];
        hex::decode_to_slice(s, &mut bytes).map_err(|e| {
            ParseUniqueIdError::BadSecret(match e {
                // Do not echo the character: it is (part of) a secret.
                hex::FromHexError::InvalidHexCharacter { index, .. } => {
                    format!("non-hex character at position {index}")
                }
                e => e.to_string(),
            })
        })?;
        Ok(Secret(bytes))
    }

    /// The 32 lowercase hex digits [`Secret::from_hex`] parses (the form of `OXCCL_SECRET`).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Root address plus secret: everything a rank needs to join a bootstrap.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    root: SocketAddr,
    secret: Secret,
}

impl UniqueId {
    /// A new id for a root that will listen on `root`, with a fresh random secret.
    ///
    /// `root` must be an address the other ranks can dial, with a fixed port; rank 0 binds it
    /// in [`Bootstrap::init`](crate::Bootstrap::init). To let the OS pick the port, use
    /// [`UniqueId::listen`].
    ///
    /// # Errors
    /// [`Error::System`] if the OS random source fails.
    pub fn new(root: SocketAddr) -> Result<Self> {
        Ok(UniqueId {
            root,
            secret: Secret::random()?,
        })
    }

    /// An id from a known root address and secret.
    pub const fn from_parts(root: SocketAddr, secret: Secret) -> Self {
        UniqueId { root, secret }
    }

    /// Binds the root listener now (port 0 picks a free port) and returns the id naming it.
    /// Pass the listener to [`Bootstrap::init_root`](crate::Bootstrap::init_root) on rank 0.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if `bind` has an unspecified IP (`0.0.0.0`, `::`), which
    /// peers could not dial; [`Error::System`] if binding fails.
    pub fn listen(bind: SocketAddr) -> Result<(Self, RootListener)> {
        if bind.ip().is_unspecified() {
            return Err(Error::InvalidUsage(format!(
                "UniqueId::listen({bind}): give the address peers should dial, not an unspecified one"
            )));
        }
        let listener = RootListener::bind(bind)?;
        let id = UniqueId::new(listener.local_addr())?;
        Ok((id, listener))
    }

    /// The address rank 0 listens on.
    pub const fn root(&self) -> SocketAddr {
        self.root
    }

    /// The shared secret.
    pub const fn secret(&self) -> &Secret {
        &self.secret
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{UNIQUE_ID_PREFIX}{}@{}",
            self.secret.to_hex(),
            self.root
        )
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("root", &self.root)
            .field("secret", &self.secret)
            .finish()
    }
}

impl FromStr for UniqueId {
    type Err = ParseUniqueIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let rest = s
            .strip_prefix(UNIQUE_ID_PREFIX)
            .ok_or(ParseUniqueIdError::BadPrefix)?;
        let (secret, addr) = rest
            .split_once('@')
            .ok_or(ParseUniqueIdError::MissingAddress)?;
        let secret = Secret::from_hex(secret)?;
        let root = addr
            .parse::<SocketAddr>()
            .map_err(|_| ParseUniqueIdError::BadAddress(truncate(addr, 64)))?;
        Ok(UniqueId { root, secret })
    }
}

/// Why a string is not a `UniqueId`. The messages never repeat secret characters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseUniqueIdError {
    /// The string does not start with [`UNIQUE_ID_PREFIX`].
    #[error("not an oxccl unique id: expected a string starting with `{UNIQUE_ID_PREFIX}`")]
    BadPrefix,
    /// No `@<ip>:<port>` after the secret.
    #[error("malformed oxccl unique id: missing `@<ip>:<port>` after the secret")]
    MissingAddress,
    /// The secret part is not 32 hex digits.
    #[error("malformed oxccl unique id: bad secret: {0}")]
    BadSecret(String),
    /// The address part is not `ip:port` / `[ipv6]:port`.
    #[error("malformed oxccl unique id: `{0}` is not an `ip:port` address")]
    BadAddress(String),
}

fn truncate(s: &str, max_chars: usize) -> String {
    let mut out: String = s.chars().take(max_chars).collect();
    if s.chars().count() > max_chars {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Guards against the string form not parsing back to the same id (a rank would then
    // join with another secret and be refused).
    #[test]
    fn round_trips_v4_and_v6() {
        for addr in ["127.0.0.1:29500", "[::1]:1", "[fe80::1]:65535"] {
            let id = UniqueId::new(addr.parse().unwrap()).unwrap();
            let s = id.to_string();
            assert!(s.starts_with(UNIQUE_ID_PREFIX));
            assert_eq!(s.parse::<UniqueId>().unwrap(), id);
            // Environment variables often end with a newline.
            assert_eq!(format!("  {s}\n").parse::<UniqueId>().unwrap(), id);
        }
    }

    /// Guards against the hex form of a secret not parsing back to the same bytes, against
    /// upper-case digits (as some tools print them) being refused, and against a bad
    /// character's position being misreported or the character itself echoed.
    #[test]
    fn secret_hex_round_trips() {
        let s = Secret::from_bytes([
            0x00, 0x1f, 0xa0, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ]);
        assert_eq!(s.to_hex(), "001fa0ff0102030405060708090a0b0c");
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert_eq!(
            Secret::from_hex("001FA0FF0102030405060708090A0B0C").unwrap(),
            s
        );
        let e = Secret::from_hex("001fa0ff010203040506070809q a0b0").unwrap_err();
        assert_eq!(
            e,
            ParseUniqueIdError::BadSecret("non-hex character at position 26".into())
        );
    }

    // Guards against two ids sharing a secret (the RNG not being used).
    #[test]
    fn secrets_are_random() {
        let a = Secret::random().unwrap();
        let b = Secret::random().unwrap();
        assert_ne!(a, b);
    }

    // Guards against the secret leaking into logs through `Debug`.
    #[test]
    fn debug_hides_secret() {
        let id = UniqueId::from_parts(
            "127.0.0.1:1".parse().unwrap(),
            Secret::from_bytes([0xab; 16]),
        );
        let dbg = format!("{id:?}");
        assert!(!dbg.contains("abab"), "{dbg}");
        assert!(dbg.contains("127.0.0.1:1"));
    }

    // Guards against garbage ids panicking or being accepted, and against error messages
    // echoing secret characters.
    #[test]
    fn garbage_is_a_clear_error() {
        let good_secret = "00112233445566778899aabbccddeeff";
        let cases: &[(&str, ParseUniqueIdError)] = &[
            ("", ParseUniqueIdError::BadPrefix),
            ("hello", ParseUniqueIdError::BadPrefix),
            ("oxccl2:00@1.2.3.4:5", ParseUniqueIdError::BadPrefix),
            ("oxccl1:", ParseUniqueIdError::MissingAddress),
            ("oxccl1:0011", ParseUniqueIdError::MissingAddress),
        ];
        for (s, want) in cases {
            assert_eq!(&s.parse::<UniqueId>().unwrap_err(), want, "{s:?}");
        }
        assert!(matches!(
            "oxccl1:0011@1.2.3.4:5".parse::<UniqueId>(),
            Err(ParseUniqueIdError::BadSecret(_))
        ));
        let e = "oxccl1:zz112233445566778899aabbccddeeff@1.2.3.4:5"
            .parse::<UniqueId>()
            .unwrap_err();
        assert!(matches!(e, ParseUniqueIdError::BadSecret(_)));
        assert!(!e.to_string().contains("zz"), "{e}");
        let e = format!("oxccl1:{good_secret}@1.2.3.4")
            .parse::<UniqueId>()
            .unwrap_err();
        assert!(matches!(e, ParseUniqueIdError::BadAddress(_)), "{e}");
        assert!(
            format!("oxccl1:{good_secret}@1.2.3.4:99999")
                .parse::<UniqueId>()
                .is_err()
        );
        // Multi-byte characters must not make the length check or slicing panic.
        assert!(
            format!("oxccl1:{}@1.2.3.4:5", "é".repeat(16))
                .parse::<UniqueId>()
                .is_err()
        );
    }
}
