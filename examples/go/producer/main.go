// Command producer publishes delayed jobs to delayd over its lmstfy-compatible HTTP API.
//
// Standard library only. Each job's body is "<prefix>-<n>"; for every job published it prints
// "published <job_id> <body>".
//
//	go run ./producer --count 5 --delay 10 --namespace demo --queue emails
//
// The node's address and the namespace token come from --url/--token or from DELAYD_URL and
// DELAYD_TOKEN. A non-2xx answer stops the program with the status and delayd's error.
package main

import (
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

// answer is the part of delayd's JSON answers this program reads.
type answer struct {
	JobID string `json:"job_id"`
	Error string `json:"error"`
}

func envOr(name, fallback string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return fallback
}

// publish sends PUT /api/{ns}/{q} with the job's body and returns the new job's id.
func publish(client *http.Client, queueURL, token, body string, params url.Values) (string, error) {
	req, err := http.NewRequest(http.MethodPut, queueURL+"?"+params.Encode(), strings.NewReader(body))
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("X-Token", token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("cannot reach delayd: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("reading the answer: %w", err)
	}
	var a answer
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		if json.Unmarshal(raw, &a) != nil || a.Error == "" {
			a.Error = string(raw)
		}
		return "", fmt.Errorf("publish failed: HTTP %d: %s", resp.StatusCode, a.Error)
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return "", fmt.Errorf("publish answered %q: %w", raw, err)
	}
	return a.JobID, nil
}

func main() {
	base := flag.String("url", envOr("DELAYD_URL", "http://127.0.0.1:7777"), "delayd's HTTP address")
	token := flag.String("token", envOr("DELAYD_TOKEN", ""), "a token of the namespace (or the admin token)")
	namespace := flag.String("namespace", "demo", "namespace")
	queue := flag.String("queue", "example", "queue")
	count := flag.Uint("count", 10, "jobs to publish")
	delay := flag.Uint("delay", 0, "seconds until each job is due")
	ttl := flag.Uint("ttl", 3600, "seconds a job lives unconsumed (0: forever)")
	tries := flag.Uint("tries", 3, "deliveries before the dead letter")
	prefix := flag.String("prefix", "job", "bodies are <prefix>-<n>")
	flag.Parse()

	queueURL := strings.TrimRight(*base, "/") + "/api/" + url.PathEscape(*namespace) + "/" + url.PathEscape(*queue)
	params := url.Values{
		"delay": {strconv.FormatUint(uint64(*delay), 10)},
		"ttl":   {strconv.FormatUint(uint64(*ttl), 10)},
		"tries": {strconv.FormatUint(uint64(*tries), 10)},
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for n := uint(0); n < *count; n++ {
		body := fmt.Sprintf("%s-%d", *prefix, n)
		id, err := publish(client, queueURL, *token, body, params)
		if err != nil {
			fmt.Fprintf(os.Stderr, "producer: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("published %s %s\n", id, body)
	}
}
