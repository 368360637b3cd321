//! The input format: a byte string read as a sequence of [`Op`]s. Every field is raw bytes;
//! what a selector names (which communicator, window or pointer) is decided when the operation
//! runs, against the state the earlier operations left. [`Op::encode`] writes the bytes
//! [`Op::decode`] reads back, so seeds are written as operations.

/// Reads bytes from the input; past its end every read yields zero (and [`Reader::done`]).
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    /// `true` once every byte was read.
    pub fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    /// The next two bytes, little endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
}

/// Names a communicator: `kind` picks NULL, a made-up address, a destroyed handle or a live
/// one; `index` which of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommSel {
    /// 0: NULL, 1: a made-up address, 2: a destroyed communicator, else a live one.
    pub kind: u8,
    /// Which one (modulo the number there are).
    pub index: u8,
}

/// Names a buffer: a window or allocation of the calling rank, of another rank, a stale one,
/// or NULL, plus a byte offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufSel {
    /// 0: NULL, 1: a made-up address, 2: a freed allocation or deregistered window, 3: another
    /// communicator's window, 4: an allocation of this rank (registered or not), else a window
    /// of this rank.
    pub kind: u8,
    /// Which one.
    pub index: u8,
    /// Byte offset; 0xFFFF: the end of the buffer, 0xFFFE: an offset that wraps the address.
    pub offset: u16,
}

/// The arguments of one collective call (the buffers of every rank are derived from them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallSpec {
    /// 0: all-reduce, 1: all-gather, 2: reduce-scatter.
    pub kind: u8,
    /// `symmDataType_t` raw value (values past the last type are invalid; 0xFF: -1).
    pub dtype: u8,
    /// `symmRedOp_t` raw value (likewise).
    pub op: u8,
    /// Element count; 0xFFFF: `usize::MAX`, 0xFFFE: `1 << 62`, 0xFFFD: `usize::MAX / 2 + 1`,
    /// 0xFFFC: as many as fit the window after the offsets.
    pub count: u16,
}

/// One step of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `symmCommInitAll` of `1 + nranks % 4` ranks.
    InitAll {
        /// Rank count selector.
        nranks: u8,
    },
    /// `symmGetUniqueId` and `symmCommInitRank` of `1 + nranks % 4` ranks, one thread each.
    InitUniqueId {
        /// Rank count selector.
        nranks: u8,
    },
    /// `symmMemAlloc` on one comm.
    Alloc {
        /// The comm.
        comm: CommSel,
        /// Bytes; 0xFFFF: `usize::MAX`, 0xFFFE: just over the size limit.
        size: u16,
    },
    /// `symmMemAlloc` of `size` bytes on every rank of a communicator.
    AllocAll {
        /// Which communicator.
        clique: u8,
        /// Bytes (0 is allowed and refused).
        size: u16,
    },
    /// `symmMemFree` on one comm.
    Free {
        /// The comm.
        comm: CommSel,
        /// The pointer (kind 4 / 5: the base of an allocation of this rank).
        ptr: BufSel,
    },
    /// `symmCommWindowRegister` on one rank.
    Register {
        /// The comm.
        comm: CommSel,
        /// The buffer (kind 4: inside an allocation of this rank).
        ptr: BufSel,
        /// Bytes; 0xFFFF: the rest of the allocation.
        size: u16,
        /// Bit 0: pass flags 0 instead of `SYMM_WIN_COLL_SYMMETRIC`; bit 1: NULL `win`;
        /// bit 2: flags with an extra bit.
        flags: u8,
    },
    /// `symmCommWindowRegister` of the `alloc`-th allocation at `offset` on every rank, in a
    /// group.
    RegisterAll {
        /// Which communicator.
        clique: u8,
        /// Which allocation (the same index on every rank).
        alloc: u8,
        /// Byte offset in the allocation.
        offset: u16,
        /// Bytes; 0xFFFF: the rest of the allocation.
        size: u16,
    },
    /// `symmCommWindowDeregister` on one rank.
    Deregister {
        /// The comm.
        comm: CommSel,
        /// The window (kinds as [`BufSel`]; 4 behaves as 5).
        win: BufSel,
    },
    /// `symmCommWindowDeregister` of the `win`-th window of every rank (by rank 0's
    /// registration), then `symmMemFree` of its allocation when `free` is odd.
    DeregisterAll {
        /// Which communicator.
        clique: u8,
        /// Which window.
        win: u8,
        /// Odd: free the allocations too.
        free: u8,
    },
    /// One collective call of one rank, with arbitrary buffers.
    Collective {
        /// The comm.
        comm: CommSel,
        /// What.
        call: CallSpec,
        /// Send buffer.
        send: BufSel,
        /// Receive buffer.
        recv: BufSel,
    },
    /// The same collective on every rank of a communicator (in a group): symmetric buffers in
    /// the `whole`-th and `share`-th windows.
    CollectiveAll {
        /// Which communicator.
        clique: u8,
        /// What.
        call: CallSpec,
        /// Window of the buffer holding all ranks' shares (all-gather receive, reduce-scatter
        /// send; all-reduce send).
        whole: u8,
        /// Its offset in elements.
        whole_offset: u16,
        /// Window of the other buffer; 0xFF: in place.
        share: u8,
        /// Its offset in elements.
        share_offset: u16,
        /// 0..=2 (and most values): every rank alike; 3: rank `1 % n` passes another count;
        /// 4: rank `1 % n` calls another collective; 5: the last rank does not call; 6: only
        /// rank 0 calls.
        variant: u8,
    },
    /// `symmGroupStart`.
    GroupStart,
    /// `symmGroupEnd`.
    GroupEnd,
    /// `symmCommDestroy` of one comm.
    Destroy {
        /// The comm.
        comm: CommSel,
    },
    /// `symmCommDestroy` of every rank of a communicator.
    DestroyAll {
        /// Which communicator.
        clique: u8,
    },
    /// A query on one comm: count, rank, device, backend, async error, device context, last
    /// error (`what % 7`); bit 3 of `what`: a NULL output pointer.
    Query {
        /// The comm.
        comm: CommSel,
        /// Which query.
        what: u8,
        /// The window of the device-context query.
        win: BufSel,
    },
    /// `symmGetErrorString` of a raw code.
    ErrorString {
        /// The code (sign-extended).
        code: u8,
    },
    /// `symmCommInitRank` misuse: inside an open group, a rank out of range, a zeroed id, or
    /// `nranks` out of range (`what % 4`).
    InitRankMisuse {
        /// Which misuse.
        what: u8,
    },
}

/// Number of distinct operation tags.
const OP_KINDS: u8 = 19;

impl CommSel {
    fn decode(r: &mut Reader) -> Self {
        CommSel {
            kind: r.u8(),
            index: r.u8(),
        }
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend([self.kind, self.index]);
    }
    /// A live communicator: the `index`-th.
    pub fn live(index: u8) -> Self {
        CommSel { kind: 3, index }
    }
}

impl BufSel {
    fn decode(r: &mut Reader) -> Self {
        BufSel {
            kind: r.u8(),
            index: r.u8(),
            offset: r.u16(),
        }
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend([self.kind, self.index]);
        out.extend(self.offset.to_le_bytes());
    }
}

impl CallSpec {
    fn decode(r: &mut Reader) -> Self {
        CallSpec {
            kind: r.u8(),
            dtype: r.u8(),
            op: r.u8(),
            count: r.u16(),
        }
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend([self.kind, self.dtype, self.op]);
        out.extend(self.count.to_le_bytes());
    }
}

impl Op {
    /// The next operation, or `None` at the end of the input.
    pub fn decode(r: &mut Reader) -> Option<Op> {
        if r.done() {
            return None;
        }
        Some(match r.u8() % OP_KINDS {
            0 => Op::InitAll { nranks: r.u8() },
            1 => Op::InitUniqueId { nranks: r.u8() },
            2 => Op::Alloc {
                comm: CommSel::decode(r),
                size: r.u16(),
            },
            3 => Op::AllocAll {
                clique: r.u8(),
                size: r.u16(),
            },
            4 => Op::Free {
                comm: CommSel::decode(r),
                ptr: BufSel::decode(r),
            },
            5 => Op::Register {
                comm: CommSel::decode(r),
                ptr: BufSel::decode(r),
                size: r.u16(),
                flags: r.u8(),
            },
            6 => Op::RegisterAll {
                clique: r.u8(),
                alloc: r.u8(),
                offset: r.u16(),
                size: r.u16(),
            },
            7 => Op::Deregister {
                comm: CommSel::decode(r),
                win: BufSel::decode(r),
            },
            8 => Op::DeregisterAll {
                clique: r.u8(),
                win: r.u8(),
                free: r.u8(),
            },
            9 => Op::Collective {
                comm: CommSel::decode(r),
                call: CallSpec::decode(r),
                send: BufSel::decode(r),
                recv: BufSel::decode(r),
            },
            10 => Op::CollectiveAll {
                clique: r.u8(),
                call: CallSpec::decode(r),
                whole: r.u8(),
                whole_offset: r.u16(),
                share: r.u8(),
                share_offset: r.u16(),
                variant: r.u8(),
            },
            11 => Op::GroupStart,
            12 => Op::GroupEnd,
            13 => Op::Destroy {
                comm: CommSel::decode(r),
            },
            14 => Op::DestroyAll { clique: r.u8() },
            15 => Op::Query {
                comm: CommSel::decode(r),
                what: r.u8(),
                win: BufSel::decode(r),
            },
            16 => Op::ErrorString { code: r.u8() },
            17 => Op::InitRankMisuse { what: r.u8() },
            _ => Op::GroupStart,
        })
    }

    /// Append the bytes that [`Op::decode`] reads as this operation.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Op::InitAll { nranks } => out.extend([0, nranks]),
            Op::InitUniqueId { nranks } => out.extend([1, nranks]),
            Op::Alloc { comm, size } => {
                out.push(2);
                comm.encode(out);
                out.extend(size.to_le_bytes());
            }
            Op::AllocAll { clique, size } => {
                out.extend([3, clique]);
                out.extend(size.to_le_bytes());
            }
            Op::Free { comm, ptr } => {
                out.push(4);
                comm.encode(out);
                ptr.encode(out);
            }
            Op::Register {
                comm,
                ptr,
                size,
                flags,
            } => {
                out.push(5);
                comm.encode(out);
                ptr.encode(out);
                out.extend(size.to_le_bytes());
                out.push(flags);
            }
            Op::RegisterAll {
                clique,
                alloc,
                offset,
                size,
            } => {
                out.extend([6, clique, alloc]);
                out.extend(offset.to_le_bytes());
                out.extend(size.to_le_bytes());
            }
            Op::Deregister { comm, win } => {
                out.push(7);
                comm.encode(out);
                win.encode(out);
            }
            Op::DeregisterAll { clique, win, free } => out.extend([8, clique, win, free]),
            Op::Collective {
                comm,
                call,
                send,
                recv,
            } => {
                out.push(9);
                comm.encode(out);
                call.encode(out);
                send.encode(out);
                recv.encode(out);
            }
            Op::CollectiveAll {
                clique,
                call,
                whole,
                whole_offset,
                share,
                share_offset,
                variant,
            } => {
                out.extend([10, clique]);
                call.encode(out);
                out.push(whole);
                out.extend(whole_offset.to_le_bytes());
                out.push(share);
                out.extend(share_offset.to_le_bytes());
                out.push(variant);
            }
            Op::GroupStart => out.push(11),
            Op::GroupEnd => out.push(12),
            Op::Destroy { comm } => {
                out.push(13);
                comm.encode(out);
            }
            Op::DestroyAll { clique } => out.extend([14, clique]),
            Op::Query { comm, what, win } => {
                out.push(15);
                comm.encode(out);
                out.push(what);
                win.encode(out);
            }
            Op::ErrorString { code } => out.extend([16, code]),
            Op::InitRankMisuse { what } => out.extend([17, what]),
        }
    }
}

/// Encode a whole sequence.
pub fn encode_all(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        op.encode(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_decode_is_identity() {
        let ops = [
            Op::InitAll { nranks: 3 },
            Op::AllocAll {
                clique: 0,
                size: 4096,
            },
            Op::RegisterAll {
                clique: 0,
                alloc: 0,
                offset: 0,
                size: 0xFFFF,
            },
            Op::CollectiveAll {
                clique: 0,
                call: CallSpec {
                    kind: 1,
                    dtype: 7,
                    op: 0,
                    count: 100,
                },
                whole: 0,
                whole_offset: 3,
                share: 0xFF,
                share_offset: 0,
                variant: 0,
            },
            Op::Query {
                comm: CommSel::live(2),
                what: 5,
                win: BufSel {
                    kind: 5,
                    index: 1,
                    offset: 0,
                },
            },
            Op::GroupEnd,
        ];
        let bytes = encode_all(&ops);
        let mut r = Reader::new(&bytes);
        let mut back = Vec::new();
        while let Some(op) = Op::decode(&mut r) {
            back.push(op);
        }
        assert_eq!(back, ops);
    }
}
