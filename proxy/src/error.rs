//! Errors of the proxy.

/// Why the proxy refused a trigger or failed to execute it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// Placeholder until the proxy lands.
    #[error("internal: {0}")]
    Internal(String),
}
