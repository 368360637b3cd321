//! What the ranks of a communicator spanning machines compare before any leg of a call runs:
//! the user's call (kind, data type, operator, count, root, and where its buffers lie in the
//! machine's windows), or the rank's refusal of it. Every rank all-gathers its entry and every
//! rank compares all of them, so that every rank accepts or refuses the call alike.

use crate::error::{Error, Result};

/// Where a buffer of a call lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Not used by this call on this rank (a broadcast's send buffer off the root).
    Unused,
    /// Outside every window: staged.
    Outside,
    /// In the window registered `seq`-th on the machine's communicator, at byte `offset`.
    Window {
        /// The window's registration number.
        seq: u64,
        /// Bytes from the window's base.
        offset: u64,
    },
}

/// A rank's call, as the ranks compare it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The collective's C name's index in [`NAMES`].
    pub collective: u8,
    /// The C data type.
    pub datatype: i32,
    /// The C operator (0 for collectives that reduce nothing).
    pub op: i32,
    /// The count.
    pub count: u64,
    /// The root (0 without one).
    pub root: i32,
    /// Whether the call is in place.
    pub in_place: bool,
    /// The send buffer (unused in place).
    pub send: Place,
    /// The receive buffer.
    pub recv: Place,
}

/// The collectives a spanning communicator runs, by [`Signature::collective`].
pub const NAMES: [&str; 4] = [
    "symmAllReduce",
    "symmAllGather",
    "symmReduceScatter",
    "symmBroadcast",
];

/// A rank's entry for one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The call it makes.
    Call(Signature),
    /// Its refusal of the call, with the cause.
    Refused(String),
}

fn put_place(out: &mut Vec<u8>, place: Place) {
    match place {
        Place::Unused => out.push(0),
        Place::Outside => out.push(1),
        Place::Window { seq, offset } => {
            out.push(2);
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
    }
}

impl Entry {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Entry::Call(s) => {
                out.push(0);
                out.push(s.collective);
                out.extend_from_slice(&s.datatype.to_le_bytes());
                out.extend_from_slice(&s.op.to_le_bytes());
                out.extend_from_slice(&s.count.to_le_bytes());
                out.extend_from_slice(&s.root.to_le_bytes());
                out.push(u8::from(s.in_place));
                put_place(&mut out, s.send);
                put_place(&mut out, s.recv);
            }
            Entry::Refused(cause) => {
                out.push(1);
                let bytes = cause.as_bytes();
                out.extend_from_slice(&bytes[..bytes.len().min(2048)]);
            }
        }
        out
    }

    /// Decode rank `rank`'s entry.
    pub fn decode(bytes: &[u8], rank: usize) -> Result<Entry> {
        let malformed = || Error::internal(format!("rank {rank} sent a malformed call entry"));
        if let [1, cause @ ..] = bytes {
            return Ok(Entry::Refused(String::from_utf8_lossy(cause).into_owned()));
        }
        let mut r = bytes;
        let mut take = |n: usize| -> Result<&[u8]> {
            if r.len() < n {
                return Err(malformed());
            }
            let (head, tail) = r.split_at(n);
            r = tail;
            Ok(head)
        };
        let entry = match take(1)?[0] {
            0 => {
                let collective = take(1)?[0];
                if collective as usize >= NAMES.len() {
                    return Err(malformed());
                }
                let i32_of = |b: &[u8]| i32::from_le_bytes(b.try_into().expect("4 bytes"));
                let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
                let datatype = i32_of(take(4)?);
                let op = i32_of(take(4)?);
                let count = u64_of(take(8)?);
                let root = i32_of(take(4)?);
                let in_place = match take(1)?[0] {
                    0 => false,
                    1 => true,
                    _ => return Err(malformed()),
                };
                let mut place = || -> Result<Place> {
                    Ok(match take(1)?[0] {
                        0 => Place::Unused,
                        1 => Place::Outside,
                        2 => Place::Window {
                            seq: u64_of(take(8)?),
                            offset: u64_of(take(8)?),
                        },
                        _ => return Err(malformed()),
                    })
                };
                let send = place()?;
                let recv = place()?;
                Entry::Call(Signature {
                    collective,
                    datatype,
                    op,
                    count,
                    root,
                    in_place,
                    send,
                    recv,
                })
            }
            _ => return Err(malformed()),
        };
        if !r.is_empty() {
            return Err(malformed());
        }
        Ok(entry)
    }
}

fn describe_place(place: Place) -> String {
    match place {
        Place::Unused => "unused".into(),
        Place::Outside => "outside every window (staged)".into(),
        Place::Window { seq, offset } => format!("window #{seq} at byte {offset}"),
    }
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtype = u32::try_from(self.datatype)
            .ok()
            .and_then(symm_device::DataType::from_raw)
            .map_or("?", symm_device::DataType::short_name);
        write!(
            f,
            "{} of {} {dtype} elements",
            NAMES[self.collective as usize], self.count
        )?;
        if self.collective == 0 || self.collective == 2 {
            let op = u32::try_from(self.op)
                .ok()
                .and_then(symm_device::RedOp::from_raw)
                .map_or("?", symm_device::RedOp::short_name);
            write!(f, ", op {op}")?;
        }
        if self.collective == 3 {
            write!(f, ", root {}", self.root)?;
        }
        if self.in_place {
            write!(f, ", in place")?;
        } else if self.send != Place::Unused {
            write!(f, ", sendbuff {}", describe_place(self.send))?;
        }
        write!(f, ", recvbuff {}", describe_place(self.recv))
    }
}

/// The verdict on call `number` from every rank's entry (by rank): the refusal naming the
/// first refusing rank, or the first rank whose call differs from rank 0's, or agreement.
pub fn verdict(number: u64, entries: &[Entry]) -> Result<Signature> {
    if let Some((rank, cause)) = entries.iter().enumerate().find_map(|(r, e)| match e {
        Entry::Refused(cause) => Some((r, cause)),
        Entry::Call(_) => None,
    }) {
        return Err(Error::new(
            crate::abi::symmResult_t::symmRemoteError,
            format!(
                "rank {rank} refused call {number} of the communicator spanning machines: {cause}"
            ),
        ));
    }
    let calls: Vec<Signature> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Call(s) => Some(*s),
            Entry::Refused(_) => None,
        })
        .collect();
    let first = calls[0];
    if let Some((rank, other)) = calls.iter().enumerate().find(|(_, s)| **s != first) {
        return Err(Error::invalid_usage(format!(
            "call {number} differs between ranks of the communicator spanning machines: rank 0 \
             made {first}, rank {rank} made {other}; no data moved, and the communicator is \
             failed on every rank"
        )));
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(count: u64) -> Signature {
        Signature {
            collective: 0,
            datatype: 7,
            op: 0,
            count,
            root: 0,
            in_place: false,
            send: Place::Window { seq: 1, offset: 64 },
            recv: Place::Outside,
        }
    }

    #[test]
    fn entries_round_trip_and_malformed_ones_are_refused() {
        for entry in [
            Entry::Call(call(5)),
            Entry::Call(Signature {
                in_place: true,
                send: Place::Unused,
                collective: 3,
                root: 5,
                ..call(0)
            }),
            Entry::Refused("datatype = 99 is not a symmDataType_t".into()),
        ] {
            let bytes = entry.encode();
            assert_eq!(Entry::decode(&bytes, 0).unwrap(), entry);
            for cut in 1..bytes.len() {
                if matches!(entry, Entry::Call(_)) {
                    assert!(Entry::decode(&bytes[..cut], 3).is_err());
                }
            }
        }
        assert!(Entry::decode(&[0, 9], 0).is_err());
        assert!(Entry::decode(&[], 0).is_err());
    }

    #[test]
    fn the_verdict_names_the_refusal_or_both_differing_calls() {
        let same = vec![Entry::Call(call(5)); 4];
        assert_eq!(verdict(3, &same).unwrap(), call(5));
        let mut differ = same.clone();
        differ[2] = Entry::Call(call(6));
        let e = verdict(3, &differ).unwrap_err();
        assert!(e.message.contains("call 3 differs"), "{}", e.message);
        assert!(
            e.message
                .contains("rank 0 made symmAllReduce of 5 f32 elements, op sum"),
            "{}",
            e.message
        );
        assert!(
            e.message
                .contains("rank 2 made symmAllReduce of 6 f32 elements"),
            "{}",
            e.message
        );
        let mut offsets = same.clone();
        offsets[1] = Entry::Call(Signature {
            send: Place::Window {
                seq: 1,
                offset: 128,
            },
            ..call(5)
        });
        let e = verdict(0, &offsets).unwrap_err();
        assert!(e.message.contains("window #1 at byte 128"), "{}", e.message);
        differ[1] = Entry::Refused("recvbuff is NULL".into());
        let e = verdict(3, &differ).unwrap_err();
        assert!(e.message.contains("rank 1 refused call 3"), "{}", e.message);
        assert!(e.message.contains("recvbuff is NULL"), "{}", e.message);
    }
}
