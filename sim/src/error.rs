//! [`SimError`]: why a module did not load or a grid did not launch.

/// An error of loading or launching, with a message that names the PTX line or kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimError {
    /// What went wrong.
    pub message: String,
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SimError {}

/// A [`SimError`] saying `message`.
pub(crate) fn sim_err(message: impl Into<String>) -> SimError {
    SimError {
        message: message.into(),
    }
}
