//! The bootstrap: how the ranks of a communicator made by `symmCommInitRank` find each other,
//! NCCL-shaped. `symmGetUniqueId` starts a root ([`root`]) and returns a [`UniqueId`] carrying
//! the root's address and a random secret; the application moves the id's bytes to the other
//! processes; every rank connects ([`Client`]) and joins once the root and the rank have proved
//! to each other that they know the secret ([`auth`]: a challenge–response with HMAC-SHA256;
//! the secret never crosses the wire). The root then relays all-gathers (window registration)
//! and reports ranks whose connection is lost.
//!
//! `SYMM_COMM_ID=host:port` (like `NCCL_COMM_ID`) names the root's address instead, so that
//! independently started processes agree without passing the id; rank 0 opens the root there.
//! The root listens on loopback unless `SYMM_SOCKET_ADDR` names another address.
//!
//! Every connect, accept, read and write is bounded; every message is checked ([`wire`]).

pub mod auth;
pub mod client;
pub mod root;
pub mod wire;

pub use client::Client;
pub use root::{RootHandle, start as start_root};

use crate::abi::{SYMM_UNIQUE_ID_BYTES, symmResult_t};
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

const ID_MAGIC: &[u8; 8] = b"SYMMUID2";
/// 2: the id's root speaks bootstrap protocol 2 ([`wire::PROTOCOL_VERSION`], the
/// challenge–response handshake); ids of builds that send the secret in clear are refused.
const ID_VERSION: u8 = 2;

/// A communicator's unique id: the root's address and the secret that the root and every rank
/// prove they know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId {
    address: SocketAddr,
    secret: [u8; 32],
}

impl UniqueId {
    /// The id of a root at `address` with `secret`.
    pub fn new(address: SocketAddr, secret: [u8; 32]) -> Self {
        UniqueId { address, secret }
    }

    /// The root's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The secret.
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The id's bytes: magic (8), version, family (4 or 6), port (2), address (16), then at
    /// offset 32 the secret (32), then zeros.
    pub fn encode(&self) -> [u8; SYMM_UNIQUE_ID_BYTES] {
        let mut out = [0u8; SYMM_UNIQUE_ID_BYTES];
        out[..8].copy_from_slice(ID_MAGIC);
        out[8] = ID_VERSION;
        let (family, ip) = match self.address.ip() {
            IpAddr::V4(v4) => (4, v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => (6, v6.octets()),
        };
        out[9] = family;
        out[10..12].copy_from_slice(&self.address.port().to_le_bytes());
        out[12..28].copy_from_slice(&ip);
        out[32..64].copy_from_slice(&self.secret);
        out
    }

    /// Parse an id's bytes.
    pub fn decode(bytes: &[u8; SYMM_UNIQUE_ID_BYTES]) -> Result<UniqueId> {
        let bad = |what: &str| {
            Error::invalid_argument(format!(
                "commId was not made by symmGetUniqueId of this version ({what})"
            ))
        };
        if &bytes[..8] != ID_MAGIC {
            return Err(bad("magic"));
        }
        if bytes[8] != ID_VERSION {
            return Err(bad("version"));
        }
        let port = u16::from_le_bytes([bytes[10], bytes[11]]);
        let octets: [u8; 16] = bytes[12..28].try_into().expect("16 bytes");
        let v6 = std::net::Ipv6Addr::from(octets);
        let ip = match bytes[9] {
            4 => IpAddr::V4(v6.to_ipv4_mapped().ok_or_else(|| bad("address"))?),
            6 => IpAddr::V6(v6),
            _ => return Err(bad("address family")),
        };
        if port == 0 || bytes[28..32] != [0; 4] || bytes[64..].iter().any(|b| *b != 0) {
            return Err(bad("layout"));
        }
        Ok(UniqueId {
            address: SocketAddr::new(ip, port),
            secret: bytes[32..64].try_into().expect("32 bytes"),
        })
    }

    /// The id named by `SYMM_COMM_ID` (secret from `SYMM_COMM_SECRET`), if set.
    pub fn from_env() -> Result<Option<UniqueId>> {
        match crate::config::comm_id() {
            Some((text, secret)) => parse_comm_id(&text, secret.as_deref()).map(Some),
            None => Ok(None),
        }
    }
}

/// Parse a `SYMM_COMM_ID` value (`1.2.3.4:5`, `[::1]:5`, `host:5`). Its secret is derived
/// from `secret_text` (`SYMM_COMM_SECRET`) when given, else from the address text: without
/// `SYMM_COMM_SECRET`, anyone who can reach the address can join, so use it on trusted
/// networks only.
pub fn parse_comm_id(text: &str, secret_text: Option<&str>) -> Result<UniqueId> {
    parse_root_address(text, secret_text, "SYMM_COMM_ID")
}

/// [`parse_comm_id`] of an address that came from `source` (the variables errors name).
pub fn parse_root_address(text: &str, secret_text: Option<&str>, source: &str) -> Result<UniqueId> {
    let text = text.trim();
    let bad = |why: String| Error::invalid_argument(format!("{source}: {text:?}: {why}"));
    let address = match text.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            if !text.contains(':') {
                return Err(bad("expected host:port".into()));
            }
            text.to_socket_addrs()
                .map_err(|e| bad(format!("cannot resolve: {e}")))?
                .next()
                .ok_or_else(|| bad("resolves to no address".into()))?
        }
    };
    if address.port() == 0 {
        return Err(bad("port 0".into()));
    }
    let seed = match secret_text {
        Some(secret) => format!("secret:{secret}"),
        None => format!("address:{text}"),
    };
    Ok(UniqueId::new(address, derive_secret(seed.as_bytes())))
}

/// 32 bytes mixed from `text` (SplitMix64 over the bytes, four lanes): not a cryptographic
/// hash; the protection is the secret text itself.
fn derive_secret(text: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (lane, chunk) in out.chunks_mut(8).enumerate() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(lane as u64 + 1);
        for &b in text {
            state = splitmix(state ^ b as u64);
        }
        chunk.copy_from_slice(&splitmix(state).to_le_bytes());
    }
    out
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Where a root made by `symmGetUniqueId` listens: `SYMM_SOCKET_ADDR` (an IP, or IP:port), else
/// loopback; port 0 means any free port.
pub fn listen_address_from_env() -> Result<SocketAddr> {
    parse_listen_address(crate::config::socket_address().as_deref())
}

/// Parse a `SYMM_SOCKET_ADDR` value (`None`: unset).
pub fn parse_listen_address(value: Option<&str>) -> Result<SocketAddr> {
    let Some(text) = value.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
    };
    let address = match text.parse::<SocketAddr>() {
        Ok(address) => address,
        Err(_) => text
            .parse::<IpAddr>()
            .map(|ip| SocketAddr::new(ip, 0))
            .map_err(|_| {
                Error::invalid_argument(format!(
                    "SYMM_SOCKET_ADDR={text:?} is not an IP address or IP:port"
                ))
            })?,
    };
    if address.ip().is_unspecified() {
        // The address goes into the id, for the other processes to connect to.
        return Err(Error::invalid_argument(format!(
            "SYMM_SOCKET_ADDR={text:?}: name the address of the interface the other ranks \
             reach, not an unspecified one"
        )));
    }
    Ok(address)
}

/// 32 random bytes from the kernel (secrets, nonces, sessions).
pub fn random_secret() -> Result<[u8; 32]> {
    let mut bytes = [0u8; 32];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: the pointer and length describe the unfilled part of `bytes`.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::new(
                symmResult_t::symmSystemError,
                format!("getrandom failed: {e}"),
            ));
        }
        filled += n as usize;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
