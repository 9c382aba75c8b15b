//! What went wrong for the bench consumers in a measured phase: streams lost, calls refused,
//! and the first few messages for the report. Shared by the scale and cluster benches.

/// How many error messages a phase keeps for the report.
const SAMPLES: usize = 5;

/// Error counts of a measured phase.
#[derive(Default, Clone, Debug)]
pub struct ErrorFigures {
    /// Streams that ended or failed other than as the bench asked.
    pub stream_errors: u64,
    /// Calls refused, other than `ready_refused`.
    pub rpc_errors: u64,
    /// `PartitionReady` refused with `FAILED_PRECONDITION`: the warm was cancelled or
    /// retargeted before the consumer answered (the consumer cannot know; counted apart).
    pub ready_refused: u64,
    /// The first few errors, for the report.
    pub samples: Vec<String>,
}

impl ErrorFigures {
    /// A stream ended or failed unasked.
    pub fn stream_error(&mut self, text: String) {
        self.stream_errors += 1;
        self.sample(text);
    }

    /// A call was refused.
    pub fn rpc_error(&mut self, text: String) {
        self.rpc_errors += 1;
        self.sample(text);
    }

    /// A `PartitionReady` was refused because its warm is gone.
    pub fn ready_refused(&mut self, text: String) {
        self.ready_refused += 1;
        self.sample(text);
    }

    fn sample(&mut self, text: String) {
        if self.samples.len() < SAMPLES {
            self.samples.push(text);
        }
    }
}
