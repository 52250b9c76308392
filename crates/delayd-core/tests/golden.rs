//! Golden-script tests of the state machine: each script in `tests/scripts` is a history of
//! commands; the runner applies them to an in-memory store and prints replies and states.
//! Regenerate with `UPDATE_GOLDENFILES=1 cargo test -p delayd-core --test golden`, then review
//! the diff like code.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;

use delayd_core::keys::{self, KeyRecord};
use delayd_core::{
    apply, codec, query, CatchUp, Cf, Command, Due, Effects, Entry, Job, JobId, JobTemplate,
    KvRead, MemKv, NewJob, Outcome, Overlay, QueueName, Reply, Schedule, Target, Timetable,
    Webhook,
};
use goldenscript::{Command as Line, Runner};

#[derive(Default)]
struct Machine {
    kv: MemKv,
    now: u64,
    next_id: u128,
    leases: BTreeMap<JobId, Vec<u64>>,
    seeds: u64,
}

fn queue(s: &str) -> Result<QueueName, Box<dyn Error>> {
    let (ns, q) = s.split_once('/').ok_or("queue must be ns/q")?;
    Ok(QueueName::new(ns, q))
}

fn id(s: &str) -> Result<JobId, Box<dyn Error>> {
    Ok(JobId(s.trim_start_matches('#').parse()?))
}

fn show_job(j: &Job) -> String {
    let mut s = format!(
        "#{} n{} {} {} due={} prio={} tries={}/{}",
        j.id.0,
        j.number,
        j.queue,
        j.state.as_str(),
        j.due_ms,
        j.priority,
        j.attempts,
        j.tries
    );
    if let Some(e) = j.expires_ms {
        let _ = write!(s, " expires={e}");
    }
    if let Some(l) = j.lease {
        let _ = write!(s, " lease={:x} deadline={}", l.token & 0xffff, l.deadline_ms);
    }
    if let Some(k) = &j.key {
        let _ = write!(s, " key={k}");
    }
    let c = j.counters;
    if c != Default::default() {
        let _ = write!(
            s,
            " timeouts={} releases={} buries={} kicks={}",
            c.timeouts, c.releases, c.buries, c.kicks
        );
    }
    if !j.body.is_empty() {
        let _ = write!(s, " body={}", String::from_utf8_lossy(&j.body));
    }
    for (name, value) in &j.attributes {
        let _ = write!(s, " {name}={value:?}");
    }
    s
}

/// The job events and timer lateness of one applied entry, for commands tagged `[events]`.
fn show_events(effects: &Effects) -> String {
    let mut out = String::new();
    for (q, e) in &effects.events {
        let counts = [
            ("published", e.published),
            ("reserved", e.reserved),
            ("acked", e.acked),
            ("released", e.released),
            ("timed_out", e.timed_out),
            ("expired", e.expired),
            ("dead_lettered", e.dead_lettered),
        ];
        let shown: Vec<String> =
            counts.iter().filter(|(_, n)| *n > 0).map(|(name, n)| format!("{name}={n}")).collect();
        let _ = writeln!(out, "events {q}: {}", shown.join(" "));
    }
    if !effects.timer_lateness_ms.is_empty() {
        let _ = writeln!(out, "lateness_ms={:?}", effects.timer_lateness_ms);
    }
    out
}

impl Machine {
    fn show(&mut self, outcome: &Outcome) -> String {
        match outcome {
            Err(r) => format!("rejected: {r}"),
            Ok(Reply::Published { id, number }) => {
                format!("published #{} as number {number}", id.0)
            }
            Ok(Reply::Exists { id }) => format!("exists #{}", id.0),
            Ok(Reply::Reserved(ds)) if ds.is_empty() => "no job".into(),
            Ok(Reply::Reserved(ds)) => ds
                .iter()
                .map(|d| {
                    self.leases.entry(d.job.id).or_default().push(d.lease);
                    format!("reserved {} remain={}", show_job(&d.job), d.job.remain_tries())
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Ok(Reply::Removed(true)) => "removed".into(),
            Ok(Reply::Removed(false)) => "not found".into(),
            Ok(Reply::Job(j)) => show_job(j),
            Ok(Reply::Count { count, more: false }) => format!("count={count}"),
            Ok(Reply::Count { count, more: true }) => format!("count={count} more=true"),
            Ok(Reply::Ticked { fired, more }) => format!("fired={fired} more={more}"),
            Ok(Reply::Done) => "ok".into(),
            Ok(Reply::Replaced(false)) => "set".into(),
            Ok(Reply::Replaced(true)) => "replaced".into(),
        }
    }

    fn new_job(
        &mut self,
        args: &mut goldenscript::ArgumentConsumer,
    ) -> Result<NewJob, Box<dyn Error>> {
        let id = match args.lookup_parse::<u128>("id")? {
            Some(id) => id,
            None => {
                self.next_id += 1;
                self.next_id
            }
        };
        self.next_id = self.next_id.max(id);
        let due = match (args.lookup_parse("delay")?, args.lookup_parse("at")?) {
            (_, Some(at)) => Due::At(at),
            (delay, None) => Due::After(delay.unwrap_or(0)),
        };
        Ok(NewJob {
            id: JobId(id),
            key: args.lookup_parse("key")?,
            body: args.lookup_parse::<String>("body")?.unwrap_or_default().into_bytes(),
            attributes: Default::default(),
            due,
            ttl_ms: args.lookup_parse("ttl")?,
            tries: args.lookup_parse("tries")?.unwrap_or(1),
            ttr_ms: args.lookup_parse("ttr")?.unwrap_or(30),
            priority: args.lookup_parse("prio")?.unwrap_or(10),
        })
    }

    /// The lease seed given (`seed=`), or the next of a counter.
    fn seed(&mut self, args: &mut goldenscript::ArgumentConsumer) -> Result<u64, Box<dyn Error>> {
        Ok(match args.lookup_parse("seed")? {
            Some(seed) => seed,
            None => {
                self.seeds += 1;
                self.seeds
            }
        })
    }

    fn lease(
        &self,
        job: JobId,
        args: &mut goldenscript::ArgumentConsumer,
    ) -> Result<Option<u64>, Box<dyn Error>> {
        Ok(match args.lookup_parse::<String>("lease")?.as_deref() {
            None => None,
            Some(which @ ("last" | "prev")) => {
                let seen = self.leases.get(&job).ok_or("no lease seen for job")?;
                let back = if which == "last" { 1 } else { 2 };
                Some(
                    *seen
                        .get(seen.len().checked_sub(back).ok_or("no such lease")?)
                        .ok_or("no such lease")?,
                )
            }
            Some(s) => Some(u64::from_str_radix(s, 16)?),
        })
    }

    fn target(args: &mut goldenscript::ArgumentConsumer) -> Result<Target, Box<dyn Error>> {
        if let Some(k) = args.lookup_parse::<String>("key")? {
            return Ok(Target::Key(k));
        }
        Ok(Target::Id(id(&args.next_pos().ok_or("job id expected")?.value)?))
    }

    fn dump(&self) -> Result<String, Box<dyn Error>> {
        let mut out = String::new();
        for (cf, k, v) in self.kv.iter() {
            let line = match cf {
                Cf::Jobs => show_job(&codec::decode_job(v)?),
                Cf::Timers => {
                    let (d, kind, id) = keys::parse_timer(k).ok_or("bad timer")?;
                    format!("timer {d} {kind:?} #{}", id.0)
                }
                Cf::Ready | Cf::Dead | Cf::Members => {
                    let (q, rest) = keys::split_queue(k).ok_or("bad key")?;
                    let id = keys::trailing_id(rest).ok_or("bad key")?;
                    let order: Vec<u64> = rest[..rest.len() - 16]
                        .chunks(4)
                        .map(|c| c.iter().fold(0u64, |a, b| a << 8 | u64::from(*b)))
                        .collect();
                    format!("{cf:?} {q} {order:?} #{}", id.0)
                }
                Cf::Keys => {
                    let (q, key) = keys::split_queue(k).ok_or("bad key")?;
                    let r: KeyRecord = codec::decode(v)?;
                    format!(
                        "Keys {q} {} → #{} ended={:?}",
                        String::from_utf8_lossy(key),
                        r.id.0,
                        r.ended_ms
                    )
                }
                Cf::Queues => {
                    let (q, _) = keys::split_queue(k).ok_or("bad key")?;
                    format!("Queues {q} {:?}", codec::decode::<delayd_core::QueueMeta>(v)?)
                }
                Cf::DueHist => {
                    let (q, m) = keys::split_queue(k).ok_or("bad key")?;
                    let minute = u64::from_be_bytes(m.try_into()?);
                    format!(
                        "DueHist {q} minute={minute} count={}",
                        u64::from_be_bytes(v.try_into()?)
                    )
                }
                // Floors are index keys: the first timer or ready entry a scan starts from.
                Cf::Meta if k == keys::META_TIMERS_FLOOR => match keys::parse_timer(v) {
                    Some((d, kind, id)) => {
                        format!("Meta floor/timers = timer {d} {kind:?} #{}", id.0)
                    }
                    None => format!("Meta floor/timers = {v:?}"),
                },
                Cf::Meta if k.starts_with(b"floor/ready/") => {
                    let (q, _) = keys::split_queue(&k[b"floor/ready/".len()..]).ok_or("bad key")?;
                    // The floor is the queue's first ready key left, or the end of its range.
                    let id = keys::split_queue(v)
                        .filter(|(fq, _)| *fq == q)
                        .and_then(|(_, rest)| keys::trailing_id(rest));
                    match id {
                        Some(id) => format!("Meta floor/ready {q} = #{}", id.0),
                        None => format!("Meta floor/ready {q} = end"),
                    }
                }
                Cf::Meta if k == keys::META_SCHEDULES_FLOOR => match keys::parse_schedule_due(v) {
                    Some((at, q, name)) => format!("Meta floor/schedules = {at} {q} {name}"),
                    None => "Meta floor/schedules = end".to_string(),
                },
                Cf::Meta if k.starts_with(keys::SCHEDULE_DUE_PREFIX) => {
                    let (at, q, name) = keys::parse_schedule_due(k).ok_or("bad key")?;
                    format!("Meta schedule-due {at} {q} {name}")
                }
                Cf::Meta if k.starts_with(keys::SCHEDULE_PREFIX) => {
                    let sc = codec::decode::<Schedule>(v)?;
                    format!("Meta schedule {} next={:?}", sc.name, sc.next_at_ms)
                }
                Cf::Meta if k.starts_with(keys::WEBHOOK_PREFIX) => {
                    let (q, _) =
                        keys::split_queue(&k[keys::WEBHOOK_PREFIX.len()..]).ok_or("bad key")?;
                    let w = codec::decode::<Webhook>(v)?;
                    format!("Meta webhook {q} = {} timeout={}", w.url, w.timeout_ms)
                }
                Cf::Meta if k.starts_with(keys::NUMBER_PREFIX) => {
                    let n = u64::from_be_bytes(k[keys::NUMBER_PREFIX.len()..].try_into()?);
                    let (id, q) = keys::parse_numbered(v).ok_or("bad number index value")?;
                    format!("Meta number {n} = {q} #{}", id.0)
                }
                Cf::Meta if k.starts_with(keys::TOKEN_PREFIX) => format!(
                    "Meta {} = {:?}",
                    String::from_utf8_lossy(k),
                    codec::decode::<delayd_core::TokenRecord>(v)?
                ),
                Cf::Meta => format!(
                    "Meta {} = {}",
                    String::from_utf8_lossy(k),
                    u64::from_be_bytes(v.try_into()?)
                ),
            };
            let _ = writeln!(out, "{line}");
        }
        Ok(out)
    }
}

impl Runner for Machine {
    fn run(&mut self, line: &Line) -> Result<String, Box<dyn Error>> {
        let mut args = line.consume_args();
        if let Some(now) = args.lookup_parse::<u64>("now")? {
            self.now = now;
        }
        let command = match line.name.as_str() {
            "time" => {
                args.reject_rest()?;
                return Ok(String::new());
            }
            "state" => {
                args.reject_rest()?;
                return self.dump();
            }
            "stats" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                args.reject_rest()?;
                let meta = query::queue_meta(&self.kv, &q)?;
                let hist = query::due_histogram(&self.kv, &q, self.now, &[60_000, 600_000])?;
                let next = query::next_deadline(&self.kv)?;
                let head = query::peek_ready(&self.kv, &q)?.map(|j| j.id.0);
                let dead = query::dead_letter(&self.kv, &q, 10)?
                    .iter()
                    .map(|j| j.id.0)
                    .collect::<Vec<_>>();
                return Ok(format!(
                    "paused={} delayed={} ready={} reserved={} dead={} due≤1m,≤10m,all={:?} next_deadline={:?} head={:?} dead_head={:?}\n",
                    meta.paused, meta.counts[0], meta.counts[1], meta.counts[2], meta.counts[3], hist, next, head, dead
                ));
            }
            "publish" | "republish" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let old = if line.name == "republish" {
                    Some(id(&args.next_pos().ok_or("old id expected")?.value)?)
                } else {
                    None
                };
                let job = self.new_job(&mut args)?;
                match old {
                    Some(old) => Command::Republish { queue: q, old, job },
                    None => Command::Publish { queue: q, job },
                }
            }
            "reserve" | "reserve_urgent" => {
                let mut queues = Vec::new();
                while let Some(arg) = args.next_pos() {
                    queues.push(queue(&arg.value)?);
                }
                let count = args.lookup_parse("count")?.unwrap_or(1);
                let ttr_ms = args.lookup_parse("ttr")?;
                let lease_seed = self.seed(&mut args)?;
                if line.name == "reserve" {
                    Command::Reserve { queues, count, ttr_ms, lease_seed }
                } else {
                    Command::ReserveUrgent { queues, count, ttr_ms, lease_seed }
                }
            }
            "reserve_job" => Command::ReserveJob {
                queue: queue(&args.next_pos().ok_or("queue expected")?.value)?,
                id: id(&args.next_pos().ok_or("job id expected")?.value)?,
                ttr_ms: args.lookup_parse("ttr")?,
                lease_seed: self.seed(&mut args)?,
            },
            "kick" => Command::Kick {
                queue: queue(&args.next_pos().ok_or("queue expected")?.value)?,
                limit: args.lookup_parse("limit")?.unwrap_or(1),
            },
            "kick_job" => Command::KickJob {
                queue: queue(&args.next_pos().ok_or("queue expected")?.value)?,
                id: id(&args.next_pos().ok_or("job id expected")?.value)?,
            },
            "number" => {
                let n = args.next_pos().ok_or("number expected")?.value.parse()?;
                args.reject_rest()?;
                let job = query::job_by_number(&self.kv, n)?;
                return Ok(format!("{}\n", job.map_or("no job".into(), |j| show_job(&j))));
            }
            "peek_delayed" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                args.reject_rest()?;
                let job = query::peek_delayed(&self.kv, &q)?;
                return Ok(format!("{}\n", job.map_or("no job".into(), |j| show_job(&j))));
            }
            "urgent" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let below = args.lookup_parse("below")?.unwrap_or(1024);
                args.reject_rest()?;
                return Ok(format!("{}\n", query::ready_below(&self.kv, &q, below, 1000)?));
            }
            "members" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let after = match args.lookup_parse::<String>("after")? {
                    Some(a) => Some(id(&a)?),
                    None => None,
                };
                let limit = args.lookup_parse("limit")?.unwrap_or(100);
                args.reject_rest()?;
                let ids: Vec<String> = query::members(&self.kv, &q, after, limit)?
                    .iter()
                    .map(|j| format!("#{}", j.id.0))
                    .collect();
                return Ok(format!("{}\n", ids.join(" ")));
            }
            "fail" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let id = id(&args.next_pos().ok_or("job id expected")?.value)?;
                let lease = self.lease(id, &mut args)?;
                Command::Fail {
                    queue: q,
                    id,
                    lease,
                    error: args.lookup_parse("error")?.unwrap_or_default(),
                    delay_ms: args.lookup_parse("delay")?.unwrap_or(0),
                }
            }
            "webhook_set" => Command::SetWebhook {
                queue: queue(&args.next_pos().ok_or("queue expected")?.value)?,
                webhook: Webhook {
                    url: args.lookup_parse("url")?.unwrap_or_default(),
                    timeout_ms: args.lookup_parse("timeout")?.unwrap_or(1000),
                    max_in_flight: 1,
                    rate_per_s: 0,
                    backoff_initial_ms: 10,
                    backoff_max_ms: 100,
                    secret: "s".into(),
                },
            },
            "schedule_set" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let name = args.next_pos().ok_or("name expected")?.value.clone();
                Command::SetSchedule {
                    queue: q,
                    schedule: Schedule {
                        name,
                        timetable: Timetable::Every {
                            ms: args.lookup_parse("every")?.unwrap_or(1000),
                        },
                        job: JobTemplate {
                            tries: 1,
                            ttr_ms: 30,
                            priority: 10,
                            ..JobTemplate::default()
                        },
                        start_at_ms: 0,
                        end_at_ms: None,
                        catch_up: CatchUp::Latest,
                        next_at_ms: args.lookup_parse("next")?,
                    },
                }
            }
            "schedule_delete" => Command::DeleteSchedule {
                queue: queue(&args.next_pos().ok_or("queue expected")?.value)?,
                name: args.next_pos().ok_or("name expected")?.value.clone(),
            },
            "schedule_fire" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let name = args.next_pos().ok_or("name expected")?.value.clone();
                let fire: String = args.lookup_parse("fire")?.unwrap_or_default();
                let mut jobs = Vec::new();
                for at in fire.split(',').filter(|a| !a.is_empty()) {
                    let at: u64 = at.parse()?;
                    self.next_id += 1;
                    jobs.push(NewJob {
                        id: JobId(self.next_id),
                        key: Some(format!("{name}@{at}")),
                        body: Vec::new(),
                        attributes: [("schedule".to_string(), name.clone())].into(),
                        due: Due::At(at),
                        ttl_ms: None,
                        tries: 1,
                        ttr_ms: 30,
                        priority: 10,
                    });
                }
                Command::FireSchedule {
                    queue: q,
                    name,
                    at_ms: args.lookup_parse("at")?.ok_or("at expected")?,
                    jobs,
                    next_at_ms: args.lookup_parse("next")?,
                }
            }
            "schedules" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                args.reject_rest()?;
                let mut out = String::new();
                for sc in query::schedules(&self.kv, &q)? {
                    let _ = writeln!(out, "{} next={:?}", sc.name, sc.next_at_ms);
                }
                let _ = writeln!(out, "first due: {:?}", query::next_schedule(&self.kv)?);
                return Ok(out);
            }
            "webhook_delete" => Command::DeleteWebhook {
                queue: queue(&args.next_pos().ok_or("queue expected")?.value)?,
            },
            "webhooks" => {
                args.reject_rest()?;
                let mut out = String::new();
                for (q, w) in query::webhooks(&self.kv)? {
                    let _ = writeln!(out, "{q} {} timeout={}", w.url, w.timeout_ms);
                }
                return Ok(out);
            }
            "ack" | "release" | "touch" | "bury" | "return" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let id = id(&args.next_pos().ok_or("job id expected")?.value)?;
                let lease = self.lease(id, &mut args)?;
                match line.name.as_str() {
                    "ack" => Command::Ack { queue: q, id, lease },
                    "release" => Command::Release {
                        queue: q,
                        id,
                        lease,
                        delay_ms: args.lookup_parse("delay")?.unwrap_or(0),
                        priority: args.lookup_parse("prio")?,
                    },
                    "touch" => {
                        Command::Touch { queue: q, id, lease, ttr_ms: args.lookup_parse("ttr")? }
                    }
                    "return" => {
                        Command::Return { queue: q, id, lease: lease.ok_or("lease expected")? }
                    }
                    _ => match args.lookup_parse("prio")? {
                        Some(priority) => {
                            Command::BuryWithPriority { queue: q, id, lease, priority }
                        }
                        None => Command::Bury { queue: q, id, lease },
                    },
                }
            }
            "update" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let target = Self::target(&mut args)?;
                let due = match (args.lookup_parse("delay")?, args.lookup_parse("at")?) {
                    (_, Some(at)) => Some(Due::At(at)),
                    (Some(d), None) => Some(Due::After(d)),
                    (None, None) => None,
                };
                Command::Update {
                    queue: q,
                    target,
                    due,
                    body: args.lookup_parse::<String>("body")?.map(String::into_bytes),
                    priority: args.lookup_parse("prio")?,
                }
            }
            "cancel" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                Command::Cancel { queue: q, target: Self::target(&mut args)? }
            }
            "respawn" | "purge" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                let limit = args.lookup_parse("limit")?.unwrap_or(1);
                if line.name == "respawn" {
                    Command::Respawn { queue: q, limit, ttl_ms: args.lookup_parse("ttl")? }
                } else {
                    Command::Purge { queue: q, limit }
                }
            }
            "pause" | "resume" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                Command::SetPaused { queue: q, paused: line.name == "pause" }
            }
            "destroy" => {
                let q = queue(&args.next_pos().ok_or("queue expected")?.value)?;
                Command::Destroy { queue: q, all: args.lookup_parse("all")?.unwrap_or(false) }
            }
            "tick" => Command::Tick { limit: args.lookup_parse("limit")?.unwrap_or(1000) },
            "token_create" => Command::CreateToken {
                namespace: args.next_pos().ok_or("namespace expected")?.value.clone(),
                token: args.next_pos().ok_or("token expected")?.value.clone(),
                description: args.lookup_parse("desc")?.unwrap_or_default(),
                read_limit: args.lookup_parse("read")?.unwrap_or(0),
                write_limit: args.lookup_parse("write")?.unwrap_or(0),
            },
            "token_delete" => Command::DeleteToken {
                namespace: args.next_pos().ok_or("namespace expected")?.value.clone(),
                token: args.next_pos().ok_or("token expected")?.value.clone(),
            },
            "tokens" => {
                let ns = args.next_pos().map(|a| a.value.clone());
                args.reject_rest()?;
                let mut out = String::new();
                for (t, r) in query::tokens(&self.kv, ns.as_deref())? {
                    let _ = writeln!(out, "{t} {r:?}");
                }
                return Ok(out);
            }
            name => return Err(format!("unknown command {name}").into()),
        };
        args.reject_rest()?;
        let entry = Entry::new(self.now, vec![command]);
        let mut effects = Effects::default();
        let mut overlay = Overlay::new(&self.kv);
        let outcomes = apply(&mut overlay, &entry, &mut effects)?;
        let writes: Vec<_> = overlay.into_writes().collect();
        self.kv.apply(writes);
        let mut out = String::new();
        for o in &outcomes {
            let _ = writeln!(out, "{}", self.show(o));
        }
        if effects.schedules_changed {
            let _ = writeln!(out, "schedules changed");
        }
        if effects.webhooks_changed {
            let _ = writeln!(out, "webhooks changed");
        }
        for (q, gained) in &effects.ready_queues {
            let _ = writeln!(out, "wake {q} ×{gained}");
        }
        if line.tags.contains("events") {
            out.push_str(&show_events(&effects));
        }
        Ok(out)
    }
}

macro_rules! golden {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() -> std::io::Result<()> {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/", stringify!($name));
            goldenscript::run(&mut Machine::default(), path)
        }
    )*};
}

golden!(
    publish, reserve, lease, expiry, deadletter, update, queue_ops, tokens, events, webhooks,
    beanstalk, schedules
);

/// The state machine reads everything through `KvRead`; make sure the clock query sees what
/// apply stored, so the pump and the machine agree on time.
#[test]
fn clock_never_moves_backwards() -> Result<(), Box<dyn Error>> {
    let mut kv = MemKv::default();
    for now in [100, 50, 120] {
        let mut o = Overlay::new(&kv);
        apply(&mut o, &Entry::new(now, vec![]), &mut Effects::default())?;
        let w: Vec<_> = o.into_writes().collect();
        kv.apply(w);
    }
    assert_eq!(query::clock(&kv)?, 120);
    let _ = kv.get(Cf::Meta, b"clock")?;
    Ok(())
}
