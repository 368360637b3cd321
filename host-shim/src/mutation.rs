//! Deliberate defects, to prove that the simulated GPU's tests catch what they claim to catch
//! (`cargo xtask sim --test` turns each on and expects a failure). Compiled in only with the
//! `mutations` feature, and then active only when `SYMM_MUTATION` names them (comma-separated);
//! without the feature [`active`] is a constant `false`.

/// A defect the tests must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The launch schedule forgets the user streams' wait for the collective's completion
    /// (`skip-completion-wait`): work the user queues after a collective may run before it.
    SkipCompletionWait,
    /// The collective kernels' last two parameters are passed swapped
    /// (`swap-kernel-parameters`).
    SwapKernelParameters,
    /// Grids sized as if each rank had the device to itself, and the occupancy checks that
    /// prove launches co-resident trusting that (`oversized-grids`): ranks on one device
    /// launched separately then need more resident blocks than the device holds, and a
    /// cooperative launch too large for the device reaches the driver.
    OversizedGrids,
    /// A second thread entering a call on a rank another thread is using goes ahead instead of
    /// being refused (`threads-share-a-rank`): a rank's calls get numbers in one order and may
    /// reach the device in another.
    ThreadsShareARank,
    /// Ranks of one process never compare their calls (`skip-call-agreement`): a rank whose
    /// call differs from its peers' is launched anyway.
    SkipCallAgreement,
    /// Window teardown does not wait for the callers' streams its collectives were enqueued on
    /// (`skip-window-stream-wait`), only for the internal stream: a launch on a caller's
    /// stream may still use the window's memory when it is freed.
    SkipWindowStreamWait,
    /// A rank's launch does not wait for the ranks of its device in this process to have
    /// issued the previous call (`skip-launch-pacing`): a rank's call n+1 may reach a hardware
    /// queue before a peer's call n, behind it.
    SkipLaunchPacing,
    /// A rank that fails the communicator raises only the abort words of this process's ranks
    /// (`skip-remote-abort`): ranks of other processes go on waiting until their own timeout.
    SkipRemoteAbort,
    /// No rank watches its peers' processes (`skip-process-watch`): a killed peer is found by
    /// the timeouts only.
    SkipProcessWatch,
    /// A window does not hold the memory under the windows of the other ranks of its process
    /// (`skip-peer-memory-hold`): a rank that fails and frees may unmap memory a peer's kernel
    /// still writes into.
    SkipPeerMemoryHold,
    /// Every staged send of a launch puts its ring at the start of the staging window
    /// (`p2p-rings-overlap`): two staged sends in one group overwrite each other's pieces.
    P2pRingsOverlap,
    /// A rank of a communicator spanning machines takes its own call for every rank's
    /// (`span-agreement-skipped`): calls that differ between machines run.
    SpanAgreementSkipped,
    /// A rank of a communicator spanning machines that fails tells no other rank
    /// (`span-failure-untold`): ranks of other machines find it at their timeout.
    SpanFailureUntold,
}

impl Mutation {
    /// The name `SYMM_MUTATION` uses.
    #[cfg_attr(not(feature = "mutations"), allow(dead_code))]
    pub fn name(self) -> &'static str {
        match self {
            Mutation::SkipCompletionWait => "skip-completion-wait",
            Mutation::SwapKernelParameters => "swap-kernel-parameters",
            Mutation::OversizedGrids => "oversized-grids",
            Mutation::ThreadsShareARank => "threads-share-a-rank",
            Mutation::SkipCallAgreement => "skip-call-agreement",
            Mutation::SkipWindowStreamWait => "skip-window-stream-wait",
            Mutation::SkipLaunchPacing => "skip-launch-pacing",
            Mutation::SkipRemoteAbort => "skip-remote-abort",
            Mutation::SkipProcessWatch => "skip-process-watch",
            Mutation::SkipPeerMemoryHold => "skip-peer-memory-hold",
            Mutation::P2pRingsOverlap => "p2p-rings-overlap",
            Mutation::SpanAgreementSkipped => "span-agreement-skipped",
            Mutation::SpanFailureUntold => "span-failure-untold",
        }
    }
}

/// Whether `mutation` is on (only with the `mutations` feature and `SYMM_MUTATION` naming it).
#[cfg(feature = "mutations")]
pub fn active(mutation: Mutation) -> bool {
    use std::sync::OnceLock;
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            std::env::var("SYMM_MUTATION")
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .iter()
        .any(|n| n == mutation.name())
}

/// Whether `mutation` is on: never, without the `mutations` feature.
#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub fn active(_mutation: Mutation) -> bool {
    false
}
