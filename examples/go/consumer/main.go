// Command consumer takes jobs from delayd over its lmstfy-compatible HTTP API and acks each.
//
// Standard library only. It long-polls the queue, decodes each job's body, acks the job, then
// prints "consumed <job_id> <received_at_unix_ms> <body>". It stops after --count jobs
// (exit 0) or when --timeout seconds have passed (exit 3 if fewer than --count arrived; exit 0 with
// --count 0, which means "until the timeout").
//
//	go run ./consumer --count 5 --timeout 60 --namespace demo --queue emails
//
// The node's address and the namespace token come from --url/--token or from DELAYD_URL and
// DELAYD_TOKEN. A non-2xx answer (other than "no job available") stops the program with the
// status and delayd's error.
package main

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxPoll is the longest single long-poll; the overall deadline is --timeout.
const maxPoll = 10 * time.Second

// job is the part of a reserved job this program reads.
type job struct {
	Msg   string `json:"msg"`
	JobID string `json:"job_id"`
	Data  string `json:"data"` // the body, base64
	Lease string `json:"lease"`
	Error string `json:"error"`
}

// client talks to one queue.
type client struct {
	http     *http.Client
	queueURL string
	token    string
}

// call sends a request and returns the status and the decoded JSON answer (empty if none).
func (c *client) call(method, u string) (int, job, error) {
	var j job
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		return 0, j, err
	}
	if c.token != "" {
		req.Header.Set("X-Token", c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, j, fmt.Errorf("cannot reach delayd: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, j, fmt.Errorf("reading the answer: %w", err)
	}
	if len(raw) > 0 && json.Unmarshal(raw, &j) != nil {
		j.Error = string(raw)
	}
	return resp.StatusCode, j, nil
}

// reserve sends GET /api/{ns}/{q}, long-polling up to wait; nil when no job came.
func (c *client) reserve(wait time.Duration, ttr uint) (*job, error) {
	q := url.Values{
		"timeout": {strconv.Itoa(int(wait / time.Second))},
		"ttr":     {strconv.FormatUint(uint64(ttr), 10)},
	}
	status, j, err := c.call(http.MethodGet, c.queueURL+"?"+q.Encode())
	switch {
	case err != nil:
		return nil, err
	case status == http.StatusNotFound && j.Msg == "no job available":
		return nil, nil
	case status != http.StatusOK:
		return nil, fmt.Errorf("reserve failed: HTTP %d: %s", status, j.Error)
	}
	return &j, nil
}

// ack sends DELETE /api/{ns}/{q}/job/{id}: the job is done. The lease (a delayd extension)
// makes the ack apply only while this reservation holds, not to a later redelivery.
func (c *client) ack(j *job) error {
	u := c.queueURL + "/job/" + url.PathEscape(j.JobID)
	if j.Lease != "" {
		u += "?" + url.Values{"lease": {j.Lease}}.Encode()
	}
	status, a, err := c.call(http.MethodDelete, u)
	if err != nil {
		return err
	}
	if status != http.StatusNoContent {
		return fmt.Errorf("ack of %s failed: HTTP %d: %s", j.JobID, status, a.Error)
	}
	return nil
}

func envOr(name, fallback string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return fallback
}

func run(c *client, count uint, timeout time.Duration, ttr uint) (uint, error) {
	deadline := time.Now().Add(timeout)
	var consumed uint
	for count == 0 || consumed < count {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		wait := maxPoll
		if left < wait {
			// Whole seconds, rounded up: the API's timeout is in seconds.
			wait = (left + time.Second - 1).Truncate(time.Second)
		}
		j, err := c.reserve(wait, ttr)
		if err != nil {
			return consumed, err
		}
		if j == nil {
			continue
		}
		received := time.Now().UnixMilli()
		body, err := base64.StdEncoding.DecodeString(j.Data)
		if err != nil {
			return consumed, fmt.Errorf("job %s: body is not base64: %w", j.JobID, err)
		}
		// Do the work here; ack only once it is done, so a crash means redelivery.
		if err := c.ack(j); err != nil {
			return consumed, err
		}
		consumed++
		fmt.Printf("consumed %s %d %s\n", j.JobID, received, body)
	}
	return consumed, nil
}

func main() {
	base := flag.String("url", envOr("DELAYD_URL", "http://127.0.0.1:7777"), "delayd's HTTP address")
	token := flag.String("token", envOr("DELAYD_TOKEN", ""), "a token of the namespace (or the admin token)")
	namespace := flag.String("namespace", "demo", "namespace")
	queue := flag.String("queue", "example", "queue")
	count := flag.Uint("count", 10, "stop after this many jobs (0: no limit)")
	timeout := flag.Float64("timeout", 60, "stop after this many seconds")
	ttr := flag.Uint("ttr", 30, "seconds to ack a job before it is delivered again")
	flag.Parse()

	c := &client{
		// Longer than any long-poll, so the server always answers first.
		http:     &http.Client{Timeout: maxPoll + 20*time.Second},
		queueURL: strings.TrimRight(*base, "/") + "/api/" + url.PathEscape(*namespace) + "/" + url.PathEscape(*queue),
		token:    *token,
	}
	consumed, err := run(c, *count, time.Duration(*timeout*float64(time.Second)), *ttr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "consumer: %v\n", err)
		os.Exit(1)
	}
	if *count != 0 && consumed < *count {
		fmt.Fprintf(os.Stderr, "consumer: timed out after %g s with %d of %d jobs\n", *timeout, consumed, *count)
		os.Exit(3)
	}
}
