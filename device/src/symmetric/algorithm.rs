//! The collective kernels by name: what the planner chooses and `SYMM_ALGO` forces. Which
//! function implements each (per data type and operator) is the table in [`super::dispatch`].

/// A collective kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// All-reduce, every rank reads every peer (latency).
    OneShotAllReduce,
    /// All-reduce, every rank writes low-latency lines into every peer (smallest latency;
    /// payloads up to `LL_MAX_BYTES`).
    OneShotLlAllReduce,
    /// All-reduce, reduce-scatter by loads then all-gather by stores (bandwidth).
    TwoShotAllReduce,
    /// Reduce-scatter by loads.
    ReduceScatter,
    /// All-gather by stores (data type agnostic: counts bytes).
    AllGather,
    /// All-gather over low-latency lines (bytes per rank up to `LL_MAX_BYTES`).
    LlAllGather,
    /// All-gather in `ceil(log2 n)` steps (PAT: aggregated binomial trees; data type agnostic).
    PatAllGather,
    /// Reduce-scatter in `ceil(log2 n)` steps (PAT), partials staged in the signal pad.
    PatReduceScatter,
    /// Broadcast: the root stores its bytes into every rank (data type agnostic: counts
    /// bytes).
    Broadcast,
    /// All-to-all: every rank stores segment `p` of its send buffer into peer `p` (data type
    /// agnostic: counts bytes per peer).
    AllToAll,
    /// Gather: the root loads every rank's send buffer (data type agnostic: counts bytes per
    /// rank).
    Gather,
    /// Scatter: the root stores segment `p` of its send buffer into rank `p` (data type
    /// agnostic: counts bytes per rank).
    Scatter,
    /// All-to-all-v: every rank stores its segment for peer `p`, sized by a count table in
    /// device memory, into peer `p` (data type agnostic; see [`super::all_to_all_v`]).
    AllToAllV,
    /// Send and receive between two ranks: a rank's sends and receives of one call or group
    /// (data type agnostic: counts bytes; see [`super::point_to_point`]).
    SendReceive,
}

impl Algorithm {
    /// The collective kernels whose counts the host passes: every algorithm but
    /// [`Algorithm::AllToAllV`] (its counts are in device memory, in a table of its own) and
    /// [`Algorithm::SendReceive`] (which pairs two ranks' calls, and takes no barrier or
    /// collective number).
    pub const COLLECTIVES: [Algorithm; 12] = [
        Algorithm::OneShotAllReduce,
        Algorithm::OneShotLlAllReduce,
        Algorithm::TwoShotAllReduce,
        Algorithm::ReduceScatter,
        Algorithm::AllGather,
        Algorithm::LlAllGather,
        Algorithm::PatAllGather,
        Algorithm::PatReduceScatter,
        Algorithm::Broadcast,
        Algorithm::AllToAll,
        Algorithm::Gather,
        Algorithm::Scatter,
    ];

    /// Every algorithm (every kernel of the PTX but the benchmarks'): the
    /// [`Algorithm::COLLECTIVES`], then all-to-all-v and send/receive.
    pub const ALL: [Algorithm; 14] = {
        let mut all = [Algorithm::SendReceive; 14];
        let mut i = 0;
        while i < Self::COLLECTIVES.len() {
            all[i] = Self::COLLECTIVES[i];
            i += 1;
        }
        all[12] = Algorithm::AllToAllV;
        all
    };

    /// `true` for the byte movers (the all-gathers, the broadcast, all-to-all, gather, scatter
    /// and send/receive): one kernel serves every data type.
    pub const fn is_data_type_agnostic(self) -> bool {
        matches!(
            self,
            Algorithm::AllGather
                | Algorithm::LlAllGather
                | Algorithm::PatAllGather
                | Algorithm::Broadcast
                | Algorithm::AllToAll
                | Algorithm::Gather
                | Algorithm::Scatter
                | Algorithm::AllToAllV
                | Algorithm::SendReceive
        )
    }

    /// Name, as in kernel names and `SYMM_ALGO`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::OneShotAllReduce => "one_shot_all_reduce",
            Algorithm::OneShotLlAllReduce => "one_shot_ll_all_reduce",
            Algorithm::TwoShotAllReduce => "two_shot_all_reduce",
            Algorithm::ReduceScatter => "reduce_scatter",
            Algorithm::AllGather => "all_gather",
            Algorithm::LlAllGather => "ll_all_gather",
            Algorithm::PatAllGather => "pat_all_gather",
            Algorithm::PatReduceScatter => "pat_reduce_scatter",
            Algorithm::Broadcast => "broadcast",
            Algorithm::AllToAll => "all_to_all",
            Algorithm::Gather => "gather",
            Algorithm::Scatter => "scatter",
            Algorithm::AllToAllV => "all_to_all_v",
            Algorithm::SendReceive => "send_receive",
        }
    }
}
