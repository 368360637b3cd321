//! Loom model of point-to-point pairing and rings (`sync::p2p`, docs/POINT_TO_POINT.md): every interleaving (up to a preemption bound) of a few ranks'
//! blocks, on loom's weak memory model. Shared setup: `loom_support`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p symm-device --release --test loom_p2p --target-dir
//! target/loom` (`cargo xtask test` runs every `loom_*` file).

#![cfg(loom)]

mod loom_support;

use loom_support::*;

// ---------------------------------------------------------------------------------------------
// Point-to-point pairing (`sync::p2p`, docs/POINT_TO_POINT.md).

impl World {
    /// `world` ranks whose pads hold only the pair region, as on the communicator's
    /// point-to-point window.
    fn pairs(world: usize) -> Box<World> {
        let mut model = World::with_pads(world, p2p::pair_region_bytes(world as u32) as usize);
        // The pair region is the point-to-point window's buffer: the contexts' peer bases.
        for context in &mut model.contexts {
            context.peer_bases = context.peer_signal_pads;
        }
        model
    }

    /// Declare every word of the pair regions that `sync::p2p` touches to the loom model
    /// (after any planting, before the grid).
    fn declare_pairs(&self) {
        let world = self.world();
        let layout = p2p::RegionLayout::new(world);
        // SAFETY: every address lies inside a live pad or abort word; no grid runs yet.
        unsafe {
            for context in &self.contexts {
                model_word(context.abort_flag, WordKind::AtomicU32);
            }
            for pad in &self.pad_addresses {
                for peer in 0..world {
                    for channel in 0..p2p::CHANNELS {
                        for seq in 0..p2p::SLOTS {
                            let slot = pad + layout.outbox(peer, channel, seq);
                            for word in 0..p2p::DESCRIPTOR_BYTES / 8 {
                                model_word(slot + 8 * word, WordKind::PlainU64);
                            }
                        }
                        model_word(pad + layout.posted(peer, channel), WordKind::AtomicU32);
                        model_word(pad + layout.done(peer, channel), WordKind::AtomicU32);
                        model_word(pad + layout.filled(peer, channel), WordKind::AtomicU32);
                        model_word(pad + layout.drained(peer, channel), WordKind::AtomicU32);
                    }
                }
            }
        }
    }
}

/// Sends from rank 0 to rank 1 in the model: one more than the slots, so that a slot is
/// reused.
const PAIR_SENDS: u32 = p2p::SLOTS + 1;

/// Rank 0 posts `PAIR_SENDS` sends to rank 1 without waiting in between (a group's first
/// phase), each from a send buffer of its own written just before; then waits for the last to
/// complete and reuses every send buffer. Rank 1 receives them in order into one receive
/// buffer, checking each value. The pair has made `before` sends already (its `posted` and
/// `done` words hold it), so that the sequences may wrap.
fn pair_sends_after(before: u32) {
    let model = World::pairs(2);
    // SAFETY: words of live pads; no grid runs yet; the model reads them through loom (the
    // declared objects take the values the memory holds when declared, so plant first).
    unsafe {
        let layout = p2p::RegionLayout::new(2);
        ((model.pad_addresses[1] + layout.posted(0, 0)) as *mut u32).write(before);
        ((model.pad_addresses[0] + layout.done(1, 0)) as *mut u32).write(before);
    }
    model.declare_pairs();
    let sent = Payload::new(PAIR_SENDS as usize);
    let received = Payload::new(1);
    run_grid(2, 1, &|| {
        let (rank, _) = place(1);
        // SAFETY: a host-built context whose pads hold the pair region; rank < world.
        let pairs = unsafe { p2p::Pairs::open(&model.contexts[rank]) };
        if rank == 0 {
            for k in 1..=PAIR_SENDS {
                let seq = before.wrapping_add(k);
                let buffer = (k - 1) as usize;
                sent.write(buffer, 100 + k as u64);
                let descriptor = p2p::Descriptor {
                    seq,
                    datatype: 3,
                    window: 7,
                    offset: buffer as u64,
                    bytes: 8,
                    piece: 0,
                };
                // SAFETY: rank 1 < world; sends posted in order, once each.
                unsafe { pairs.post(1, 0, descriptor) }.expect("no timeouts under loom");
            }
            // SAFETY: rank 1 < world.
            unsafe { pairs.complete(1, 0, before.wrapping_add(PAIR_SENDS)) }
                .expect("no timeouts under loom");
            for buffer in 0..PAIR_SENDS as usize {
                sent.write(buffer, 0);
            }
        } else {
            for k in 1..=PAIR_SENDS {
                let seq = before.wrapping_add(k);
                // SAFETY: rank 0 < world; receives in order, once each.
                unsafe {
                    pairs.receive(0, 0, seq, |descriptor| {
                        assert_eq!(
                            (descriptor.datatype, descriptor.window, descriptor.bytes),
                            (3, 7, 8),
                            "receive {seq}: {descriptor:?}"
                        );
                        let value = sent.read(descriptor.offset as usize);
                        assert_eq!(value, 100 + k as u64, "receive {seq}");
                        received.write(0, value);
                        Ok(())
                    })
                }
                .expect("no timeouts under loom");
            }
        }
    });
}

/// The first sends of a pair.
fn pair_sends() {
    pair_sends_after(0)
}

/// Three sends through two slots: every descriptor and payload read is ordered after its
/// writes, and every reuse (of a slot, of a send buffer) after the reads it overwrites.
#[test]
fn pair_sends_through_a_reused_slot() {
    explore(pair_sends);
}

/// The same across the wrap of the sequence numbers (u32::MAX − 1 sends made before).
#[test]
fn pair_sends_across_the_sequence_wrap() {
    explore(|| pair_sends_after(u32::MAX - 1));
}

/// Teeth: a send published before its descriptor is written.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_post_before_descriptor_is_caught() {
    explore(|| {
        mutate(Mutation::P2pPostBeforeDescriptor);
        pair_sends()
    });
}

/// Teeth: a receiver that says "done" before it copied lets the sender reuse its buffer
/// under the copy.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_done_before_copy_is_caught() {
    explore(|| {
        mutate(Mutation::P2pDoneBeforeCopy);
        pair_sends()
    });
}

/// Teeth: a sender that reuses a slot without waiting for the send that held it overwrites a
/// descriptor the receiver may still be reading.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_slot_reuse_without_waiting_is_caught() {
    explore(|| {
        mutate(Mutation::P2pSkipSlotWait);
        pair_sends()
    });
}

/// Teeth: with relaxed instead of release stores, a descriptor is not ordered before its post.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_relaxed_release_is_caught() {
    explore(|| {
        mutate(Mutation::ReleaseAsRelaxed);
        pair_sends()
    });
}

/// Teeth: with relaxed instead of acquire loads, the receiver's descriptor reads are not
/// ordered after the post it saw.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_relaxed_acquire_is_caught() {
    explore(|| {
        mutate(Mutation::AcquireAsRelaxed);
        pair_sends()
    });
}

/// Pieces rank 0 passes to rank 1 through a ring of [`p2p::RING_SLOTS`] slots: one more than
/// the slots, so that a slot is reused.
const RING_PIECES: u32 = p2p::RING_SLOTS as u32 + 1;

/// Rank 0 fills `RING_PIECES` pieces into a ring (each a payload word of its slot) and rank 1
/// copies each out in order, checking it; both counts start at `before`, so that they may
/// wrap.
fn ring_pieces_after(before: u32) {
    let model = World::pairs(2);
    let layout = p2p::RegionLayout::new(2);
    // SAFETY: words of live pads; no grid runs yet (plant first, then declare).
    unsafe {
        for (pad, word) in [
            (0, layout.fills(1, 0)),
            (1, layout.drains(0, 0)),
            (1, layout.filled(0, 0)),
            (0, layout.drained(1, 0)),
        ] {
            ((model.pad_addresses[pad] + word) as *mut u32).write(before);
        }
    }
    model.declare_pairs();
    // SAFETY: as above.
    unsafe {
        model_word(
            model.pad_addresses[0] + layout.fills(1, 0),
            WordKind::PlainU32,
        );
        model_word(
            model.pad_addresses[1] + layout.drains(0, 0),
            WordKind::PlainU32,
        );
    }
    let ring = Payload::new(p2p::RING_SLOTS as usize);
    run_grid(2, 1, &|| {
        let (rank, _) = place(1);
        // SAFETY: a host-built context whose pads hold the pair region; rank < world.
        let pairs = unsafe { p2p::Pairs::open(&model.contexts[rank]) };
        for k in 1..=RING_PIECES {
            let value = 100 + k as u64;
            if rank == 0 {
                // SAFETY: rank 1 < world; this thread is rank 0's only filler of channel 0.
                let filled =
                    unsafe { pairs.fill_piece(1, 0, |slot| ring.write(slot as usize, value)) };
                assert_eq!(filled, Ok(before.wrapping_add(k)), "no timeouts under loom");
            } else {
                // SAFETY: rank 0 < world; rank 1's only drainer of channel 0.
                let drained = unsafe {
                    pairs.drain_piece(0, 0, |slot| {
                        assert_eq!(ring.read(slot as usize), value, "piece {k}");
                    })
                };
                assert_eq!(
                    drained,
                    Ok(before.wrapping_add(k)),
                    "no timeouts under loom"
                );
            }
        }
    });
}

/// Three pieces through a ring of two slots: every piece read is ordered after its write, and
/// every slot's reuse after the read of the piece it held.
#[test]
fn ring_pieces_through_reused_slots() {
    explore(|| ring_pieces_after(0));
}

/// The same across the wrap of the piece counts.
#[test]
fn ring_pieces_across_the_count_wrap() {
    explore(|| ring_pieces_after(u32::MAX - 1));
}

/// Teeth: a sender that refills a slot without waiting for the receiver to copy out the piece
/// it held.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_ring_slot_reuse_without_waiting_is_caught() {
    explore(|| {
        mutate(Mutation::P2pRingSkipDrainWait);
        ring_pieces_after(0)
    });
}

/// Teeth: a receiver that says it copied a piece out before it did.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_ring_drain_before_copy_is_caught() {
    explore(|| {
        mutate(Mutation::P2pRingDrainBeforeCopy);
        ring_pieces_after(0)
    });
}

/// Teeth: with relaxed instead of release stores, a piece is not ordered before its count.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_ring_relaxed_release_is_caught() {
    explore(|| {
        mutate(Mutation::ReleaseAsRelaxed);
        ring_pieces_after(0)
    });
}

/// Teeth: with relaxed instead of acquire loads, a piece's read is not ordered after its count.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_ring_relaxed_acquire_is_caught() {
    explore(|| {
        mutate(Mutation::AcquireAsRelaxed);
        ring_pieces_after(0)
    });
}
