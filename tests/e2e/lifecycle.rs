//! End-to-end: the real `delayd` binary through the whole job lifecycle, then `kill -9`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Result};
use base64::Engine;
use delayd_tests::{eventually, n, now_ms, s, Api, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_through_ttr_dead_letter_respawn_and_kill9() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("node1");
    let mut server = Server::start(&data).await?;
    let api = Api::new(&server);

    // Publish a delayed job with two tries and a 1 s ttr.
    let (st, body) = api.put("/api/e2e/work?delay_ms=400&tries=2&ttr=1", "payload-1").await?;
    ensure!(st == 201, "publish: {st} {body}");
    let id = s(&body, "job_id")?;

    // Long-poll: it arrives at its due time, never before.
    let (st, job) = api.get("/api/e2e/work?timeout=5&ttr=1").await?;
    let received = now_ms();
    ensure!(st == 200, "reserve: {st} {job}");
    ensure!(s(&job, "job_id")? == id && n(&job, "attempt")? == 1 && n(&job, "remain_tries")? == 1);
    ensure!(received >= n(&job, "due_at_ms")?, "delivered early: {job}");
    let data = base64::engine::general_purpose::STANDARD.decode(s(&job, "data")?)?;
    ensure!(data == b"payload-1");
    let first_lease = s(&job, "lease")?;

    // Not acked: when the ttr expires the job comes back as attempt 2, with no tries left.
    let (st, again) = api.get("/api/e2e/work?timeout=5&ttr=1").await?;
    ensure!(st == 200, "redelivery: {st} {again}");
    ensure!(s(&again, "job_id")? == id && n(&again, "attempt")? == 2);
    ensure!(n(&again, "remain_tries")? == 0);
    ensure!(n(&again, "elapsed_ms")? >= 1400, "redelivered before the ttr expired: {again}");

    // The first consumer's late ack carries a stale lease and is refused.
    let (st, _) = api.delete(&format!("/api/e2e/work/job/{id}?lease={first_lease}")).await?;
    ensure!(st == 409, "stale ack must be refused, got {st}");

    // The last try times out too: the job lands in the dead letter.
    let head = eventually(Duration::from_secs(5), || async {
        let (_, dl) = api.get("/api/e2e/work/deadletter").await?;
        Ok((n(&dl, "deadletter_size")? == 1).then(|| dl["deadletter_head"].clone()))
    })
    .await?;
    ensure!(head.as_str() == Some(id.as_str()));

    // Respawn it; it is delivered again and acked for good with its lease.
    let (st, r) = api.put("/api/e2e/work/deadletter?limit=1&ttl=60", "").await?;
    ensure!(st == 200 && n(&r, "count")? == 1, "respawn: {st} {r}");
    let (st, job) = api.get("/api/e2e/work?timeout=5").await?;
    ensure!(st == 200 && s(&job, "job_id")? == id, "after respawn: {st} {job}");
    let (st, _) =
        api.delete(&format!("/api/e2e/work/job/{id}?lease={}", s(&job, "lease")?)).await?;
    ensure!(st == 204);
    let (st, _) = api.get(&format!("/api/e2e/work/job/{id}")).await?;
    ensure!(st == 404, "acked job must be gone");

    // Acknowledged writes of every kind, then kill -9.
    let mut expected = BTreeMap::new();
    for i in 0..50 {
        let delay = if i % 2 == 0 { "delay=0" } else { "delay=3600" };
        let (st, r) =
            api.put(&format!("/api/e2e/keep?{delay}&key=k{i}"), format!("job-{i}")).await?;
        ensure!(st == 201, "publish {i}: {st} {r}");
        expected.insert(s(&r, "job_id")?, format!("job-{i}"));
    }
    let (st, reserved) = api.get("/api/e2e/keep?count=5&ttr=600").await?;
    ensure!(st == 200 && reserved.as_array().map(Vec::len) == Some(5));
    let (_, before) = api.get("/api/e2e/keep/stats").await?;
    server.kill9()?;

    let server = server.restart().await?;
    let api = Api::new(&server);
    let (_, after) = api.get("/api/e2e/keep/stats").await?;
    for field in ["delayed", "ready", "reserved", "dead"] {
        ensure!(after[field] == before[field], "{field}: {before} vs {after}");
    }
    ensure!(
        n(&after, "delayed")? == 25 && n(&after, "ready")? == 20 && n(&after, "reserved")? == 5
    );
    for (id, body) in &expected {
        let (st, job) = api.get(&format!("/api/e2e/keep/job/{id}")).await?;
        ensure!(st == 200, "job {id} lost after kill -9: {st}");
        let data = base64::engine::general_purpose::STANDARD.decode(s(&job, "data")?)?;
        ensure!(data == body.as_bytes(), "job {id} changed");
    }
    // Keys survive too: re-publishing a key finds the existing job.
    let (st, r) = api.put("/api/e2e/keep?key=k0", "dup").await?;
    ensure!(st == 200 && s(&r, "msg")? == "exists", "{st} {r}");
    // The reservations survive with their leases: nothing reserved is handed out again.
    let (st, more) = api.get("/api/e2e/keep?count=100").await?;
    ensure!(st == 200 && more.as_array().map(Vec::len) == Some(20), "{st} {more}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly_and_keeps_data() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("node1");
    let mut server = Server::start(&data).await?;
    let api = Api::new(&server);
    let (st, r) = api.put("/api/e2e/term?delay=3600", "x").await?;
    ensure!(st == 201);
    let status = server.terminate()?;
    ensure!(status.success(), "exit status {status}; log:\n{}", server.log_text());
    let server = server.restart().await?;
    let (st, job) =
        Api::new(&server).get(&format!("/api/e2e/term/job/{}", s(&r, "job_id")?)).await?;
    ensure!(st == 200 && s(&job, "state")? == "delayed", "{st} {job}");
    Ok(())
}
