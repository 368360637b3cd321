//! Proofs of knowing a communicator's secret, without sending it.
//!
//! **The bootstrap handshake.** A joining rank connects to the root and sends a `Challenge`:
//! the protocol version, a fresh random nonce, `nranks` and its rank. The root answers with
//! its own fresh nonce and its proof, `HMAC-SHA256(secret, label | "root" | transcript)`,
//! where the transcript is the version, `nranks`, the rank and both nonces. The rank checks
//! that proof before it sends anything else: a process on the root's address that does not
//! know the secret is refused, and has learnt only the rank's nonce. Then the rank sends its
//! own proof, `HMAC-SHA256(secret, label | "rank" | transcript)`, with its join information,
//! and the root checks it before accepting anything from the connection. Both nonces are
//! fresh on every connection, so no proof can be replayed on another; the role is bound, so
//! the root's proof never passes for a rank's (a reflection); every comparison is constant
//! time (`hmac`'s `verify_slice`). Neither the secret nor anything computed from the secret
//! alone crosses the wire.
//!
//! **File descriptors between ranks** ([`crate::transport::link`]) carry a tag bound to the
//! communicator's session (a random value the root hands every rank in its `Welcome`), the
//! registration, the sender and the receiver ([`fd_tag`]).

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Domain label of the bootstrap handshake's proofs.
const PROOF_LABEL: &[u8] = b"symm bootstrap proof v2\0";
/// Domain label of the tags on file-descriptor messages between ranks.
const FD_LABEL: &[u8] = b"symm fd-pass tag v3\0";

/// Which side of the handshake makes a proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The bootstrap root.
    Root,
    /// A joining rank.
    Rank,
}

impl Role {
    fn label(self) -> &'static [u8; 4] {
        match self {
            Role::Root => b"root",
            Role::Rank => b"rank",
        }
    }
}

/// What both proofs of one handshake bind: every field has a fixed length, so that the
/// concatenation is unambiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transcript {
    /// Bootstrap protocol version ([`super::wire::PROTOCOL_VERSION`]).
    pub version: u32,
    /// Ranks of the communicator, as the joining rank says.
    pub nranks: u32,
    /// The joining rank.
    pub rank: u32,
    /// The rank's fresh nonce.
    pub rank_nonce: [u8; 32],
    /// The root's fresh nonce.
    pub root_nonce: [u8; 32],
}

fn keyed(secret: &[u8; 32]) -> HmacSha256 {
    <HmacSha256 as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length")
}

fn proof_mac(secret: &[u8; 32], role: Role, t: &Transcript) -> HmacSha256 {
    let mut mac = keyed(secret);
    mac.update(PROOF_LABEL);
    mac.update(role.label());
    mac.update(&t.version.to_le_bytes());
    mac.update(&t.nranks.to_le_bytes());
    mac.update(&t.rank.to_le_bytes());
    mac.update(&t.rank_nonce);
    mac.update(&t.root_nonce);
    mac
}

/// `role`'s proof of knowing `secret` in the handshake `t`.
pub fn proof(secret: &[u8; 32], role: Role, t: &Transcript) -> [u8; 32] {
    proof_mac(secret, role, t).finalize().into_bytes().into()
}

/// `true` when `proof` is `role`'s proof of knowing `secret` in the handshake `t` (compared in
/// constant time).
pub fn verify_proof(secret: &[u8; 32], role: Role, t: &Transcript, proof: &[u8]) -> bool {
    proof_mac(secret, role, t).verify_slice(proof).is_ok()
}

fn fd_mac(
    secret: &[u8; 32],
    session: &[u8; 32],
    seq: u64,
    source: u32,
    destination: u32,
) -> HmacSha256 {
    let mut mac = keyed(secret);
    mac.update(FD_LABEL);
    mac.update(session);
    mac.update(&seq.to_le_bytes());
    mac.update(&source.to_le_bytes());
    mac.update(&destination.to_le_bytes());
    mac
}

/// The tag on the file descriptors of registration `seq` that rank `source` sends to rank
/// `destination` of the communicator with `secret` and `session`.
pub fn fd_tag(
    secret: &[u8; 32],
    session: &[u8; 32],
    seq: u64,
    source: u32,
    destination: u32,
) -> [u8; 32] {
    fd_mac(secret, session, seq, source, destination)
        .finalize()
        .into_bytes()
        .into()
}

/// `true` when `tag` is [`fd_tag`] of these arguments (compared in constant time).
pub fn verify_fd_tag(
    secret: &[u8; 32],
    session: &[u8; 32],
    seq: u64,
    source: u32,
    destination: u32,
    tag: &[u8],
) -> bool {
    fd_mac(secret, session, seq, source, destination)
        .verify_slice(tag)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            version: 2,
            nranks: 4,
            rank: 1,
            rank_nonce: [1; 32],
            root_nonce: [2; 32],
        }
    }

    #[test]
    fn hmac_sha256_matches_rfc_4231_case_2() {
        // Key "Jefe", data "what do ya want for nothing?".
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let want = [
            0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95,
            0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9,
            0x64, 0xec, 0x38, 0x43,
        ];
        assert_eq!(mac.finalize().into_bytes().as_slice(), &want);
    }

    #[test]
    fn a_proof_verifies_only_for_its_secret_role_and_transcript() {
        let secret = [7; 32];
        let t = transcript();
        let p = proof(&secret, Role::Rank, &t);
        assert!(verify_proof(&secret, Role::Rank, &t, &p));
        assert!(!verify_proof(&secret, Role::Root, &t, &p), "role bound");
        let mut other = secret;
        other[31] ^= 1;
        assert!(!verify_proof(&other, Role::Rank, &t, &p), "secret bound");
        for change in 0..5 {
            let mut u = t;
            match change {
                0 => u.version += 1,
                1 => u.nranks += 1,
                2 => u.rank += 1,
                3 => u.rank_nonce[0] ^= 1,
                _ => u.root_nonce[31] ^= 1,
            }
            assert!(
                !verify_proof(&secret, Role::Rank, &u, &p),
                "change {change}"
            );
        }
        assert!(!verify_proof(&secret, Role::Rank, &t, &p[..31]), "length");
        assert!(!verify_proof(&secret, Role::Rank, &t, &[]), "empty");
        assert_ne!(p, secret, "the proof is not the secret");
    }

    #[test]
    fn an_fd_tag_is_bound_to_session_registration_and_both_ranks() {
        let (secret, session) = ([3; 32], [4; 32]);
        let tag = fd_tag(&secret, &session, 9, 1, 2);
        assert!(verify_fd_tag(&secret, &session, 9, 1, 2, &tag));
        assert!(!verify_fd_tag(&secret, &[5; 32], 9, 1, 2, &tag));
        assert!(!verify_fd_tag(&secret, &session, 10, 1, 2, &tag));
        assert!(!verify_fd_tag(&secret, &session, 9, 2, 1, &tag));
        assert!(!verify_fd_tag(&secret, &session, 9, 1, 3, &tag));
        assert!(!verify_fd_tag(&[6; 32], &session, 9, 1, 2, &tag));
    }
}
