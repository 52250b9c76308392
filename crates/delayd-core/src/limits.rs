//! Bounds on the work one command does, part of the state machine's definition.
//!
//! Every replica must stop a command at the same place, so these are constants of the
//! machine, not settings: changing one changes how a log replays. They keep the memory an
//! entry's application needs (the [`crate::Overlay`] holds every record it rewrites) and the
//! time it holds the apply loop independent of the data: a destroy of a million jobs, a
//! respawn of large dead jobs or a tick over a backlog proceed in several entries, each
//! reporting `more`, and the caller proposes the next.
//!
//! The limits on what one *request* may carry (body, attributes, horizon, bulk size) belong to
//! the edge, which refuses oversized requests before anything is proposed.

/// Most jobs one `Destroy`, `Respawn` or `Purge` touches; the rest is left for the next
/// command of the chunked operation.
pub const MAX_JOBS_PER_COMMAND: u32 = 1000;

/// Most bytes of job records one `Destroy`, `Respawn`, `Purge` or `Tick` reads and rewrites
/// before it stops and reports `more`. A command always makes progress: the job that crosses
/// the bound is still processed.
pub const MAX_WORK_BYTES_PER_COMMAND: usize = 8 * 1024 * 1024;

/// Most bytes of bodies and attributes one `Reserve` hands out. It stops before the job that
/// would cross the bound, but always delivers at least one job, so the reply to a reserve
/// stays well inside every transport limit whatever `count` asked for.
pub const MAX_RESERVE_BYTES: usize = 8 * 1024 * 1024;
