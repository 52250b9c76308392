//! Recurring jobs: schedules set, listed and removed through the log, their timetables, and
//! the firing of due occurrences that the leader's schedule pump (`scheduler.rs`) asks for.
//!
//! The timetable is computed here, outside the state machine: a cron expression read in a
//! time zone depends on the tz database compiled into this binary, which must never decide
//! replicated state on its own (two versions could disagree during an upgrade). The node
//! that proposes a schedule or fires an occurrence computes the next occurrence and carries
//! it in the command; the state machine only keeps it.

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::TimeZone;
use delayd_core::{
    query, CatchUp, Command, Due, JobTemplate, NewJob, QueueName, Reply, Schedule, Timetable,
};

use super::auth::{Access, Principal, Scope};
use super::validate::{self, check_name, new_job, PublishParams, DEFAULT_PRIORITY, DEFAULT_TTR_MS};
use super::{unexpected, Service};
use crate::error::ServiceError;

/// The shortest period of an `every_ms` schedule.
pub const MIN_EVERY_MS: u64 = 100;
/// Longest schedule name: room for `@{occurrence}` in a job key.
pub const MAX_NAME_BYTES: usize = 200;
/// Most occurrences one firing publishes (catch-up `all`); the rest follow in later ones.
pub const MAX_FIRE_BATCH: usize = 100;
/// Most occurrences a cron schedule's catch-up steps through to find the latest one.
const MAX_STEPS: usize = 100_000;

/// A schedule as a client asks for it.
#[derive(Clone, Debug, Default)]
pub struct ScheduleRequest {
    /// A cron expression, seconds first (6 fields, or 7 with a year).
    pub cron: Option<String>,
    /// A period in ms instead.
    pub every_ms: Option<u64>,
    /// The IANA time zone a cron expression is read in; UTC when absent.
    pub tz: Option<String>,
    /// The jobs' body.
    pub body: Vec<u8>,
    /// The jobs' ttl in ms; `None`: the default day, `Some(0)`: never expires.
    pub ttl_ms: Option<u64>,
    /// The jobs' tries; 1 when absent.
    pub tries: Option<u16>,
    /// The jobs' ttr in ms; the default when absent.
    pub ttr_ms: Option<u64>,
    /// The jobs' priority.
    pub priority: Option<u32>,
    /// The jobs' attributes (the schedule's name is added as `schedule`).
    pub attributes: BTreeMap<String, String>,
    /// No occurrence before (unix ms); now when absent.
    pub start_at_ms: Option<u64>,
    /// No occurrence after (unix ms).
    pub end_at_ms: Option<u64>,
    /// `latest` (default), `none` or `all`.
    pub catch_up: Option<String>,
}

/// A timetable ready to compute with.
pub(crate) enum Compiled {
    Every { anchor: u64, ms: u64 },
    Cron { schedule: Box<cron::Schedule>, tz: chrono_tz::Tz },
}

impl Compiled {
    /// Parses a stored timetable; `start` anchors `Every`.
    pub(crate) fn new(timetable: &Timetable, start: u64) -> Result<Compiled, ServiceError> {
        match timetable {
            Timetable::Every { ms } => Ok(Compiled::Every { anchor: start, ms: (*ms).max(1) }),
            Timetable::Cron { expr, tz } => {
                let schedule = cron::Schedule::from_str(expr).map_err(|e| {
                    ServiceError::bad_request(format!("invalid cron expression {expr:?}: {e}"))
                })?;
                let tz = chrono_tz::Tz::from_str(tz).map_err(|_| {
                    ServiceError::bad_request(format!(
                        "unknown time zone {tz:?} (use an IANA name)"
                    ))
                })?;
                Ok(Compiled::Cron { schedule: Box::new(schedule), tz })
            }
        }
    }

    /// The first occurrence strictly after `t` (unix ms), if any.
    pub(crate) fn next_after(&self, t: u64) -> Option<u64> {
        match self {
            Compiled::Every { anchor, ms } => Some(if t < *anchor {
                *anchor
            } else {
                anchor.saturating_add(((t - anchor) / ms + 1).saturating_mul(*ms))
            }),
            Compiled::Cron { schedule, tz } => {
                let at = tz.timestamp_millis_opt(i64::try_from(t).ok()?).single()?;
                let next = schedule.after(&at).next()?;
                u64::try_from(next.timestamp_millis()).ok()
            }
        }
    }
}

/// The schedule's occurrences from `after` on, within its window: the first strictly after.
fn next_in_window(s: &Schedule, c: &Compiled, after: u64) -> Option<u64> {
    let from = after.max(s.start_at_ms.saturating_sub(1));
    c.next_after(from).filter(|n| s.end_at_ms.is_none_or(|end| *n <= end))
}

/// What one firing of a due schedule does: the occurrences to publish and the next one.
pub(crate) fn plan(
    s: &Schedule,
    at: u64,
    now: u64,
) -> Result<(Vec<u64>, Option<u64>), ServiceError> {
    let c = Compiled::new(&s.timetable, s.start_at_ms)?;
    let after = next_in_window(s, &c, at);
    // On time: the occurrence after this one is still ahead.
    if after.is_none_or(|n| n > now) {
        return Ok((vec![at], after));
    }
    // Missed by more than a period.
    Ok(match s.catch_up {
        CatchUp::None => (Vec::new(), next_in_window(s, &c, now)),
        CatchUp::All => {
            let mut fire = vec![at];
            let mut next = after;
            while let Some(n) = next.filter(|n| *n <= now && fire.len() < MAX_FIRE_BATCH) {
                fire.push(n);
                next = next_in_window(s, &c, n);
            }
            (fire, next)
        }
        CatchUp::Latest => {
            let mut latest = at;
            let mut steps = 0;
            while let Some(n) = next_in_window(s, &c, latest).filter(|n| *n <= now) {
                latest = n;
                steps += 1;
                if steps >= MAX_STEPS {
                    break;
                }
            }
            (vec![latest], next_in_window(s, &c, latest.max(now)))
        }
    })
}

impl Service {
    /// Creates or replaces a schedule of `queue`; returns it with its first occurrence and
    /// whether it replaced one. `request` decodes the front end's message, and runs only once
    /// the caller is authorized.
    pub async fn set_schedule(
        &self,
        caller: &Principal,
        queue: QueueName,
        name: &str,
        request: impl FnOnce() -> Result<ScheduleRequest, ServiceError>,
    ) -> Result<(Schedule, bool), ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        check_name("schedule", name)?;
        if name.len() > MAX_NAME_BYTES {
            return Err(ServiceError::bad_request(format!(
                "schedule names are at most {MAX_NAME_BYTES} bytes"
            )));
        }
        let schedule = self.checked_schedule(name, request()?)?;
        let command = Command::SetSchedule { queue: queue.clone(), schedule: schedule.clone() };
        match self.write_one(command).await? {
            Reply::Replaced(replaced) => {
                tracing::info!(%queue, name, replaced, next_at_ms = ?schedule.next_at_ms, "schedule set");
                Ok((schedule, replaced))
            }
            r => Err(unexpected(r)),
        }
    }

    fn checked_schedule(&self, name: &str, r: ScheduleRequest) -> Result<Schedule, ServiceError> {
        let timetable = match (r.cron, r.every_ms) {
            (Some(expr), None) => {
                Timetable::Cron { expr, tz: r.tz.unwrap_or_else(|| "UTC".into()) }
            }
            (None, Some(_)) if r.tz.is_some() => {
                return Err(ServiceError::bad_request("tz applies to cron schedules only"));
            }
            (None, Some(ms)) => {
                if ms < MIN_EVERY_MS {
                    return Err(ServiceError::bad_request(format!(
                        "every_ms must be at least {MIN_EVERY_MS}"
                    )));
                }
                self.checks().horizon("every_ms", ms)?;
                Timetable::Every { ms }
            }
            _ => return Err(ServiceError::bad_request("give one of cron and every_ms")),
        };
        let catch_up = match r.catch_up.as_deref() {
            None | Some("latest") => CatchUp::Latest,
            Some("none") => CatchUp::None,
            Some("all") => CatchUp::All,
            Some(other) => {
                return Err(ServiceError::bad_request(format!(
                    "invalid catch_up {other:?}: expected latest, none or all"
                )))
            }
        };
        let job = JobTemplate {
            body: r.body,
            attributes: r.attributes,
            ttl_ms: validate::ttl(r.ttl_ms),
            tries: r.tries.unwrap_or(1),
            ttr_ms: r.ttr_ms.unwrap_or(DEFAULT_TTR_MS),
            priority: r.priority.unwrap_or(DEFAULT_PRIORITY),
        };
        // Each occurrence is an ordinary publish, held to every bound of one.
        let checks = self.checks();
        checks.publish(&template_params(name, &job, Due::After(0)))?;
        checks.body(&job.body)?;
        let now = self.now_ms();
        let start_at_ms = r.start_at_ms.unwrap_or(now);
        if let Some(end) = r.end_at_ms {
            if end <= start_at_ms {
                return Err(ServiceError::bad_request("end_at_ms must be after start_at_ms"));
            }
        }
        let mut schedule = Schedule {
            name: name.to_string(),
            timetable,
            job,
            start_at_ms,
            end_at_ms: r.end_at_ms,
            catch_up,
            next_at_ms: None,
        };
        let compiled = Compiled::new(&schedule.timetable, start_at_ms)?;
        schedule.next_at_ms =
            next_in_window(&schedule, &compiled, now.max(start_at_ms).saturating_sub(1));
        Ok(schedule)
    }

    /// The schedules of `queue`, ordered by name.
    pub async fn schedules(
        &self,
        caller: &Principal,
        queue: &QueueName,
        stale: bool,
    ) -> Result<Vec<Schedule>, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(stale, |v| query::schedules(v, queue)).await
    }

    /// One schedule of `queue`.
    pub async fn schedule(
        &self,
        caller: &Principal,
        queue: &QueueName,
        name: &str,
        stale: bool,
    ) -> Result<Schedule, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(stale, |v| query::schedule(v, queue, name)).await?.ok_or_else(|| {
            ServiceError::NotFound(format!("queue {queue} has no schedule {name:?}"))
        })
    }

    /// Removes a schedule; jobs it already published stay.
    pub async fn delete_schedule(
        &self,
        caller: &Principal,
        queue: QueueName,
        name: &str,
    ) -> Result<(), ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        let command = Command::DeleteSchedule { queue: queue.clone(), name: name.to_string() };
        match self.write_one(command).await? {
            Reply::Removed(true) => Ok(()),
            Reply::Removed(false) => {
                Err(ServiceError::NotFound(format!("queue {queue} has no schedule {name:?}")))
            }
            r => Err(unexpected(r)),
        }
    }

    /// The earliest next occurrence of any schedule, from this replica (the leader's is
    /// current).
    pub(crate) async fn next_schedule(
        &self,
    ) -> Result<Option<(u64, QueueName, String)>, ServiceError> {
        self.read(true, |v| query::next_schedule(v)).await
    }

    /// Fires the due occurrence `at` of a schedule as planned for `now`; with `skip`, moves
    /// the schedule past `now` publishing nothing (what the pump does when firing keeps
    /// failing, so one schedule cannot hold up the others). Returns how many jobs it
    /// published.
    pub(crate) async fn fire_schedule(
        &self,
        queue: QueueName,
        name: String,
        at: u64,
        now: u64,
        skip: bool,
    ) -> Result<u64, ServiceError> {
        let Some(s) = self.read(true, |v| query::schedule(v, &queue, &name)).await? else {
            return Ok(0);
        };
        let planned = if skip {
            Compiled::new(&s.timetable, s.start_at_ms)
                .map(|c| (Vec::new(), next_in_window(&s, &c, now)))
        } else {
            plan(&s, at, now)
        };
        let (mut fire, mut next_at_ms) = planned.unwrap_or_else(|e| {
            // This binary cannot read the timetable (a zone its tz data lacks): it ends.
            tracing::warn!(%queue, name, error = %e, "schedule cannot be evaluated; it ends");
            (Vec::new(), None)
        });
        // All of a firing's jobs go into one log entry: at most half an entry's worth.
        let per_job = s.job.body.len()
            + s.job.attributes.iter().map(|(k, v)| k.len() + v.len() + 8).sum::<usize>()
            + name.len()
            + 512;
        let most = (self.config().max_entry_bytes / 2 / per_job).max(1);
        if fire.len() > most {
            next_at_ms = Some(fire[most]);
            fire.truncate(most);
        }
        let jobs = fire.into_iter().map(|occ| occurrence_job(&s, occ)).collect();
        let command = Command::FireSchedule { queue, name, at_ms: at, jobs, next_at_ms };
        match self.write_one(command).await? {
            Reply::Count { count, .. } => Ok(count),
            r => Err(unexpected(r)),
        }
    }
}

/// The publish parameters of one occurrence's job.
fn template_params(name: &str, t: &JobTemplate, due: Due) -> PublishParams {
    let mut attributes = t.attributes.clone();
    attributes.insert("schedule".into(), name.to_string());
    PublishParams {
        due,
        ttl_ms: t.ttl_ms,
        tries: t.tries,
        ttr_ms: t.ttr_ms,
        priority: t.priority,
        key: Some(format!("{name}@0000000000000")),
        attributes,
    }
}

/// The job of occurrence `at`: key `{name}@{at}`, due at `at`.
fn occurrence_job(s: &Schedule, at: u64) -> NewJob {
    let mut p = template_params(&s.name, &s.job, Due::At(at));
    p.key = Some(format!("{}@{at}", s.name));
    new_job(&p, s.job.body.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(timetable: Timetable, catch_up: CatchUp) -> Schedule {
        Schedule {
            name: "s".into(),
            timetable,
            job: JobTemplate::default(),
            start_at_ms: 1_000,
            end_at_ms: None,
            catch_up,
            next_at_ms: None,
        }
    }

    #[test]
    fn every_counts_from_its_start_and_catch_up_follows_the_policy() {
        let s = schedule(Timetable::Every { ms: 100 }, CatchUp::Latest);
        assert_eq!(plan(&s, 1_000, 1_005).expect("plan"), (vec![1_000], Some(1_100)), "on time");
        assert_eq!(plan(&s, 1_000, 1_550).expect("plan"), (vec![1_500], Some(1_600)), "latest");
        let none = Schedule { catch_up: CatchUp::None, ..s.clone() };
        assert_eq!(plan(&none, 1_000, 1_550).expect("plan"), (vec![], Some(1_600)));
        let all = Schedule { catch_up: CatchUp::All, ..s.clone() };
        let (fire, next) = plan(&all, 1_000, 1_250).expect("plan");
        assert_eq!((fire, next), (vec![1_000, 1_100, 1_200], Some(1_300)));
        let (fire, next) = plan(&all, 1_000, 1_000_000).expect("plan");
        assert_eq!((fire.len(), next), (MAX_FIRE_BATCH, Some(11_000)), "bounded per firing");
        let ending = Schedule { end_at_ms: Some(1_150), ..s };
        assert_eq!(plan(&ending, 1_100, 1_100).expect("plan"), (vec![1_100], None), "ended");
    }

    /// Europe/Berlin springs forward on 2026-03-29 (02:00 → 03:00) and falls back on
    /// 2026-10-25 (03:00 → 02:00). A daily 02:30 occurrence does not exist on the first day
    /// and is skipped; on the second it exists twice and fires once.
    #[test]
    fn cron_follows_the_zone_across_dst() {
        let c = Compiled::new(
            &Timetable::Cron { expr: "0 30 2 * * *".into(), tz: "Europe/Berlin".into() },
            0,
        )
        .expect("valid");
        let ms = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s).expect("date").timestamp_millis() as u64
        };
        let mut t = ms("2026-03-27T12:00:00Z");
        let mut got = Vec::new();
        for _ in 0..3 {
            t = c.next_after(t).expect("next");
            got.push(t);
        }
        // 02:30 CET is 01:30 UTC; 02:30 CEST is 00:30 UTC; 2026-03-29 has no 02:30.
        assert_eq!(
            got,
            [ms("2026-03-28T01:30:00Z"), ms("2026-03-30T00:30:00Z"), ms("2026-03-31T00:30:00Z")]
        );
        let mut t = ms("2026-10-24T12:00:00Z");
        let mut got = Vec::new();
        for _ in 0..2 {
            t = c.next_after(t).expect("next");
            got.push(t);
        }
        assert_eq!(got, [ms("2026-10-25T00:30:00Z"), ms("2026-10-26T01:30:00Z")]);
        assert!(Compiled::new(&Timetable::Cron { expr: "x".into(), tz: "UTC".into() }, 0).is_err());
        let bad_zone = Timetable::Cron { expr: "0 * * * * *".into(), tz: "Mars/Base".into() };
        assert!(Compiled::new(&bad_zone, 0).is_err());
    }
}
