//! The history of a run: one [`Op`] per client operation, written as JSON lines.

use serde::{Deserialize, Serialize};

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The server confirmed it.
    Ok,
    /// The server refused it; it did not happen.
    Fail,
    /// Timed out or ambiguous: it may or may not have happened.
    Unknown,
}

/// A job handed to a consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Server job id.
    pub job_id: String,
    /// The body, which the workload makes unique per publish.
    pub body: String,
    /// Delivery number.
    pub attempt: u32,
    /// Lease token.
    pub lease: String,
}

/// What an operation asked for, and what it got when it succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum Call {
    /// Publish a unique body, optionally under a key.
    Publish {
        /// Unique body.
        body: String,
        /// Delay asked for.
        delay_ms: u64,
        /// Idempotency key.
        key: Option<String>,
        /// The id the server answered.
        job_id: Option<String>,
    },
    /// Reserve with a time-to-run.
    Reserve {
        /// Time-to-run asked for.
        ttr_ms: u64,
        /// Jobs received (empty when none was available).
        got: Vec<Delivery>,
    },
    /// Ack a delivery with its lease.
    Ack {
        /// Job id.
        job_id: String,
        /// The lease shown.
        lease: String,
    },
    /// Release a delivery.
    Release {
        /// Job id.
        job_id: String,
        /// The lease shown.
        lease: String,
    },
    /// The final listing of the dead letter, after the drain.
    DeadLetter {
        /// Bodies found there.
        bodies: Vec<String>,
    },
}

/// One client operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Logical client process; a new one after every unknown outcome.
    pub process: u64,
    /// When the client sent it (harness monotonic ms).
    pub invoke_ms: u64,
    /// When the client saw the answer or gave up.
    pub complete_ms: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// What it was.
    pub call: Call,
}

/// Parses a JSONL history.
pub fn parse(jsonl: &str) -> Result<Vec<Op>, serde_json::Error> {
    jsonl.lines().filter(|l| !l.trim().is_empty()).map(serde_json::from_str).collect()
}

/// Writes a history as JSONL.
pub fn to_jsonl(ops: &[Op]) -> Result<String, serde_json::Error> {
    let mut out = String::new();
    for op in ops {
        out.push_str(&serde_json::to_string(op)?);
        out.push('\n');
    }
    Ok(out)
}
