//! The trace of a run: a hash of every step (what a replay must reproduce exactly), and,
//! when asked for, the steps as text (a failing seed is run again with the text on, which
//! a deterministic replay makes the same run).

use std::collections::VecDeque;
use std::hash::Hasher;

/// FNV-1a, 64 bits: a hash with no per-process seed, so a trace hash means the same in
/// every run.
#[derive(Clone, Debug)]
pub struct TraceHasher(u64);

impl Default for TraceHasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for TraceHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // One multiply per word: the trace hashes millions of words per second.
        self.0 ^= n;
        self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        self.0 ^= self.0 >> 29;
    }
}

/// The hash of a run's steps, and the last steps as text when recording.
#[derive(Debug)]
pub struct Trace {
    hasher: TraceHasher,
    /// How many steps ran.
    pub steps: u64,
    /// The last steps as text (kept only when recording).
    lines: Option<VecDeque<String>>,
    keep: usize,
}

impl Trace {
    /// The longest line kept (a record's bytes say little beyond that).
    const WIDTH: usize = 240;

    /// A trace that hashes only, or also keeps the last `keep` steps as text.
    pub fn new(keep: Option<usize>) -> Self {
        Self {
            hasher: TraceHasher::default(),
            steps: 0,
            lines: keep.map(VecDeque::with_capacity),
            keep: keep.unwrap_or(0),
        }
    }

    /// Mixes words into the hash.
    pub fn mix(&mut self, words: &[u64]) {
        for word in words {
            self.hasher.write_u64(*word);
        }
    }

    /// Mixes bytes into the hash.
    pub fn mix_bytes(&mut self, bytes: &[u8]) {
        self.hasher.write(bytes);
    }

    /// Whether step text is kept (so callers format it only then).
    pub fn recording(&self) -> bool {
        self.lines.is_some()
    }

    /// Keeps one line of text, when recording.
    pub fn line(&mut self, line: impl FnOnce() -> String) {
        if let Some(lines) = &mut self.lines {
            if lines.len() == self.keep {
                lines.pop_front();
            }
            let mut line = line();
            if line.len() > Self::WIDTH {
                let mut end = Self::WIDTH;
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                line.truncate(end);
                line.push('…');
            }
            lines.push_back(line);
        }
    }

    /// The hash so far.
    pub fn hash(&self) -> u64 {
        self.hasher.finish()
    }

    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines.iter().flatten().cloned().collect()
    }
}
