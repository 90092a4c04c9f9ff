//! Where the collector's own lines go. The library never prints: the live collector hands
//! its finding lines and warnings to a [`Console`] its caller chose (the CLI writes them on
//! stderr; a test or a benchmark keeps them or drops them).

/// A sink for what the collector says while it runs. Called from connection threads.
pub trait Console: Send + Sync {
    /// One live line: a finding raised, upgraded, downgraded or resolved.
    fn line(&self, text: &str);
    /// Something the user should know (a trace that cannot be written, a detector bug).
    fn warn(&self, text: &str);
}

/// Says nothing (the server's default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Console for Silent {
    fn line(&self, _text: &str) {}
    fn warn(&self, _text: &str) {}
}
