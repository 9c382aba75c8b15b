//! [`Findings`]: everything a fault scenario found wrong, reported all at once.

/// Everything a scenario found wrong; fails the test with all of it.
#[derive(Default)]
pub struct Findings(Vec<String>);

impl Findings {
    /// Notes `what` unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.0.push(what.into());
        }
    }

    /// Notes each of `found`, prefixed with `what`.
    pub fn extend(&mut self, what: &str, found: Vec<String>) {
        self.0.extend(found.into_iter().map(|f| format!("{what}: {f}")));
    }

    /// Whether nothing was noted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Fails the test if anything was noted.
    pub fn finish(self, scenario: &str) {
        assert!(self.0.is_empty(), "{scenario}:\n  - {}", self.0.join("\n  - "));
    }
}
