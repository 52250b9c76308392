//! The documentation stands on its own: every relative link in the README and the Markdown
//! files of the repository resolves to a file inside the repository, every `#anchor` names a
//! heading of its page, and no page points outside the repository (a clone has nothing
//! there). Also: every setting of `delayd.example.toml` is in docs/configuration.md's table.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the repository").into()
}

/// Every Markdown file of the repository but build output and recorded chaos runs.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "runs") {
                    walk(&path, out);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root(), &mut files);
    files.sort();
    files
}

/// The text outside fenced code blocks and inline code spans, line by line.
fn prose(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            lines.push(String::new());
            continue;
        }
        if fenced {
            lines.push(String::new());
            continue;
        }
        // Drop inline code: every other piece between backticks.
        let kept: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        lines.push(kept);
    }
    lines
}

/// The targets of the inline links and images of a line: `[text](target)`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                let target = after[..end].split_whitespace().next().unwrap_or_default();
                targets.push(target.to_string());
                rest = &after[end..];
            }
            None => break,
        }
    }
    targets
}

/// GitHub's anchor for a heading: the rendered text in lower case, without punctuation but
/// `-` and `_`, spaces as `-`.
fn slug(heading: &str) -> String {
    // A link in a heading renders as its text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](").and_then(|m| rest[open + m..].find(')').map(|c| (m, c))) {
            Some((mid, close)) => {
                text.push_str(&rest[..open]);
                text.push_str(&rest[open + 1..open + mid]);
                rest = &rest[open + mid + close + 1..];
            }
            None => break,
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings, numbered as GitHub numbers repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if fenced || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().replace(['*', '`'], "").as_str());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

#[test]
fn every_relative_link_resolves_inside_the_repository() {
    let root = root().canonicalize().expect("the repository");
    let files = markdown_files();
    assert!(files.iter().any(|f| f.ends_with("README.md")), "the README is found");
    assert!(files.iter().any(|f| f.ends_with("docs/design.md")), "docs/ is found");
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = fs::read_to_string(file).expect("read");
        let dir = file.parent().expect("a file has a directory");
        let name = file.strip_prefix(&root).unwrap_or(file).display().to_string();
        for (n, line) in prose(&text).iter().enumerate() {
            for target in link_targets(line) {
                let at = format!("{name}:{}: {target}", n + 1);
                if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let resolved = if path.is_empty() { file.clone() } else { dir.join(path) };
                let Ok(resolved) = resolved.canonicalize() else {
                    broken.push(format!("{at}: no such file"));
                    continue;
                };
                if !resolved.starts_with(&root) {
                    broken.push(format!("{at}: outside the repository"));
                    continue;
                }
                if let Some(anchor) = anchor {
                    if resolved.extension().is_some_and(|e| e == "md") {
                        let page = fs::read_to_string(&resolved).expect("read");
                        if !anchors(&page).contains(anchor) {
                            broken.push(format!("{at}: no heading with that anchor"));
                        }
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked > 100, "only {checked} links were checked");
}

#[test]
fn no_page_points_outside_the_repository() {
    for file in markdown_files() {
        let text = fs::read_to_string(&file).expect("read");
        assert!(!text.contains("../shared"), "{} mentions ../shared", file.display());
    }
}

#[test]
fn the_configuration_page_lists_every_setting() {
    let example = fs::read_to_string(root().join("delayd.example.toml")).expect("example");
    let page = fs::read_to_string(root().join("docs/configuration.md")).expect("page");
    // Keys of the example, set or commented out: `key = value` or `# key = value`.
    let keys: BTreeSet<&str> = example
        .lines()
        .map(|l| l.trim_start_matches('#').trim())
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    assert!(keys.len() > 40, "only {} keys found in the example", keys.len());
    let missing: Vec<_> = keys.iter().filter(|k| !page.contains(&format!("`{k}`"))).collect();
    assert!(missing.is_empty(), "docs/configuration.md does not list {missing:?}");
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("`PUT /api/{ns}/{q}`".replace('`', "").as_str()), "put-apinsq");
    assert_eq!(slug("Health, metrics and the dashboard"), "health-metrics-and-the-dashboard");
    assert_eq!(
        slug("Rotating the admin token (two rolling restarts)"),
        "rotating-the-admin-token-two-rolling-restarts"
    );
    let page = "# A\n## B\n## B\n```\n# not a heading\n```\n";
    let expected: BTreeSet<String> = ["a", "b", "b-1"].iter().map(|s| s.to_string()).collect();
    assert_eq!(anchors(page), expected);
}
