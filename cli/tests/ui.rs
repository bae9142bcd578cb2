//! The dashboard at `/ui` in a real headless Chromium (Debian's `chromium`
//! and `chromium-driver`, driven over WebDriver with fantoccini), against
//! the whole stack as real processes.
//!
//! Checks: every page loads with no console error; a submitted job appears
//! in the jobs list and its timeline shows its events; a cancel from the UI
//! lands in the log; a tenant token sees only its tenant. A screenshot of
//! each page is kept in `target/<profile>/ui-screenshots/`.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (or
//! `GPUSCHED_CHROMIUM`, `GPUSCHED_CHROMEDRIVER`): `scripts/test-deps`
//! installs them; without them this test fails saying so.

mod stack;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use gpusched_events::Event;
use gpusched_model::{JobId, JobSpec};
use serde_json::{json, Value};

const VISION_TOKEN: &str = "ui-test-vision-token";
const LANGUAGE_TOKEN: &str = "ui-test-language-token";

fn tool(var: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        path.exists(),
        "{} not found: the dashboard test needs Debian's chromium and chromium-driver. \
         Run scripts/test-deps (as root it installs them: apt-get install -y chromium \
         chromium-driver), or set {var} to the program",
        path.display()
    );
    path
}

/// chromedriver as a child process, killed on drop.
struct Driver {
    child: Child,
    url: String,
    profile: tempfile::TempDir,
}

impl Driver {
    fn start() -> Driver {
        let exe = tool("GPUSCHED_CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = gpusched_testkit::free_port().expect("a free port");
        let child = Command::new(exe)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver {
            child,
            url,
            profile: tempfile::tempdir().expect("profile dir"),
        }
    }

    async fn browser(&self) -> Client {
        let chromium = tool("GPUSCHED_CHROMIUM", "/usr/bin/chromium");
        let mut caps = Capabilities::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,1000",
                    format!("--user-data-dir={}", self.profile.path().display()),
                ],
            }),
        );
        caps.insert("goog:loggingPrefs".into(), json!({ "browser": "ALL" }));
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// chromedriver's browser log (console messages and failed loads), which
/// WebDriver proper does not expose; reading it empties it.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(r#"{"type":"browser"}"#.to_string()),
        )
    }
}

/// The console errors logged since the last call.
async fn console_errors(c: &Client) -> Vec<String> {
    let log = c.issue_cmd(BrowserLog).await.expect("browser log");
    log.as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["level"] == "SEVERE")
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_gpusched"))
        .parent()
        .expect("target dir")
        .join("ui-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// Keeps a screenshot of the page as `name.png` and fails on any console
/// error the page logged.
async fn page_ok(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    std::fs::write(screenshots().join(format!("{name}.png")), png).expect("write screenshot");
    let errors = console_errors(c).await;
    assert!(errors.is_empty(), "console errors on {name}: {errors:#?}");
}

/// Waits until `script` (a JS expression) is truthy on the page.
async fn until(c: &Client, what: &str, script: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = c
            .execute(&format!("return !!({script});"), vec![])
            .await
            .expect("script");
        if v == Value::Bool(true) {
            return;
        }
        if Instant::now() > deadline {
            let text = c
                .execute("return document.body.innerText;", vec![])
                .await
                .unwrap_or_default();
            panic!("timed out waiting for {what}; the page reads:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn text_of(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .expect("text")
}

async fn log_in(c: &Client, base: &str, token: &str) {
    c.goto(&format!("{base}/ui/")).await.expect("open /ui/");
    let input = c
        .wait()
        .for_element(Locator::Css("#token"))
        .await
        .expect("the login form");
    input.send_keys(token).await.expect("type the token");
    c.find(Locator::Css("#login button[type=submit]"))
        .await
        .expect("log in button")
        .click()
        .await
        .expect("log in");
    until(
        c,
        "the queues page",
        "document.querySelector('#queues table')",
    )
    .await;
}

fn spec(tenant: &str, max_runtime_s: u64) -> JobSpec {
    serde_json::from_value(json!({
        "tenant": tenant, "workers": 1, "gpus_per_worker": 8,
        "max_runtime_s": max_runtime_s,
    }))
    .expect("a job spec")
}

async fn submit(http: &str, token: &str, spec: &JobSpec) -> u64 {
    let r = reqwest::Client::new()
        .post(format!("{http}/v1/jobs"))
        .bearer_auth(token)
        .json(spec)
        .send()
        .await
        .expect("submit");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    r.json::<Value>().await.expect("reply")["id"]
        .as_u64()
        .expect("an id")
}

fn write_tokens(dir: &Path) -> PathBuf {
    let path = dir.join("tokens.toml");
    let entry = |tenant: &str, token: &str| {
        format!(
            "[[tokens]]\nname = \"{tenant}-ui\"\ntenant = \"{tenant}\"\nblake3 = \"{}\"\n",
            gpusched_gateway::hash_token(token)
        )
    };
    let text = entry("vision", VISION_TOKEN) + &entry("language", LANGUAGE_TOKEN);
    std::fs::write(&path, text).expect("tokens file");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    let driver = Driver::start();
    let tmp = tempfile::tempdir().expect("tmp");
    let tokens = write_tokens(tmp.path());
    let mut stack = stack::new().await;
    stack.args("gateway", &["--tokens-file", &tokens.display().to_string()]);
    stack::start_all(&mut stack).await;
    let http = stack.http.clone();

    // A short job that runs to its end, a long one to cancel from the UI,
    // and another tenant's job the vision token must not see.
    let done = submit(&http, VISION_TOKEN, &spec("vision", 60)).await;
    let long = submit(&http, VISION_TOKEN, &spec("vision", 3_600_000)).await;
    let other = submit(&http, LANGUAGE_TOKEN, &spec("language", 3_600_000)).await;
    // A GPU-hour budget, which the queues page shows in a column of its own.
    let r = reqwest::Client::new()
        .put(format!("{http}/v1/tenants/vision/budgets/h100-80g"))
        .bearer_auth(stack::ADMIN_TOKEN)
        .json(&json!({"gpu_hours": 500, "period": "month"}))
        .send()
        .await
        .expect("set a budget");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());

    let c = driver.browser().await;

    // --- the admin sees every page ---
    log_in(&c, &http, stack::ADMIN_TOKEN).await;
    until(&c, "the three tenants", "['vision','language','speech'].every(t => document.querySelector('#queues').innerText.includes(t))").await;
    until(
        &c,
        "vision's budget",
        "document.querySelector('#queues').innerText.includes('of 500 GPU-h this month')",
    )
    .await;
    page_ok(&c, "queues").await;

    c.goto(&format!("{http}/ui/#/cluster"))
        .await
        .expect("cluster");
    until(
        &c,
        "the heatmap",
        "document.querySelectorAll('#cluster .cell').length === 96",
    )
    .await;
    // A node holding the long job opens the jobs on it.
    until(
        &c,
        "a node in use",
        "document.querySelector('#cluster .cell.s-used, #cluster .cell.s-full')",
    )
    .await;
    c.find(Locator::Css("#cluster .cell.s-used, #cluster .cell.s-full"))
        .await
        .expect("a used node")
        .click()
        .await
        .expect("open the node");
    until(
        &c,
        "the node's jobs",
        "document.querySelector('#node-detail a[href^=\"#/jobs/\"]')",
    )
    .await;
    page_ok(&c, "cluster").await;

    c.goto(&format!("{http}/ui/#/jobs")).await.expect("jobs");
    for id in [done, long, other] {
        until(
            &c,
            &format!("job {id} listed"),
            &format!("document.querySelector('#jobs a[href=\"#/jobs/{id}\"]')"),
        )
        .await;
    }
    page_ok(&c, "jobs").await;

    // The short job's timeline shows what the log holds, live.
    c.goto(&format!("{http}/ui/#/jobs/{done}"))
        .await
        .expect("job page");
    until(
        &c,
        "the job to end",
        "document.querySelector('#job-state')?.innerText.startsWith('succeeded')",
    )
    .await;
    for lane in ["pending", "admitted", "bound", "running"] {
        until(
            &c,
            &format!("a {lane} bar"),
            &format!("document.querySelector('svg.gantt rect[data-state={lane}]')"),
        )
        .await;
    }
    until(
        &c,
        "the end marked",
        "document.querySelector('svg.gantt line[data-kind=job_finished]')",
    )
    .await;
    let explain = text_of(&c, "#explain").await;
    assert!(explain.contains("submitted"), "explain text: {explain}");
    page_ok(&c, "job").await;

    // --- the vision tenant: its own jobs only, and a cancel that lands ---
    c.find(Locator::Css("#logout"))
        .await
        .expect("log out")
        .click()
        .await
        .expect("log out");
    until(&c, "the login form", "document.querySelector('#token')").await;
    log_in(&c, &http, VISION_TOKEN).await;
    let queues = text_of(&c, "#queues").await;
    assert!(
        queues.contains("vision") && !queues.contains("language"),
        "vision's queues: {queues}"
    );
    c.goto(&format!("{http}/ui/#/jobs")).await.expect("jobs");
    until(
        &c,
        "vision's long job",
        &format!("document.querySelector('#jobs a[href=\"#/jobs/{long}\"]')"),
    )
    .await;
    let jobs = text_of(&c, "#jobs").await;
    assert!(
        !jobs.contains("language"),
        "a tenant sees only its jobs: {jobs}"
    );
    let listed = c
        .find_all(Locator::Css(&format!("#jobs a[href=\"#/jobs/{other}\"]")))
        .await
        .expect("find");
    assert!(listed.is_empty(), "job {other} is language's");
    page_ok(&c, "jobs-tenant").await;

    c.goto(&format!("{http}/ui/#/jobs/{long}"))
        .await
        .expect("job page");
    until(
        &c,
        "the long job running",
        "document.querySelector('#job-state')?.innerText === 'running'",
    )
    .await;
    c.find(Locator::Css("#cancel-job"))
        .await
        .expect("cancel")
        .click()
        .await
        .expect("cancel");
    c.wait()
        .for_element(Locator::Css("#cancel-confirm"))
        .await
        .expect("confirm")
        .click()
        .await
        .expect("confirm cancel");
    until(
        &c,
        "the cancel recorded",
        "document.querySelector('#cancel [role=status]')",
    )
    .await;
    page_ok(&c, "job-cancel").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = stack.store.job_events(JobId(long)).await.expect("log");
        if events.iter().any(|e| {
            matches!(
                e.event,
                Event::JobCancelRequested { .. } | Event::JobCancelled { .. }
            )
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the UI's cancel never reached the log"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until(
        &c,
        "the page to follow the cancel",
        "document.querySelector('#job-state')?.innerText.match(/cancel/)",
    )
    .await;

    // Another tenant's job is not found, as if it did not exist.
    c.goto(&format!("{http}/ui/#/jobs/{other}"))
        .await
        .expect("job page");
    until(&c, "not found", "document.querySelector('#job .error')").await;
    assert!(text_of(&c, "#job .error")
        .await
        .contains(&format!("no job {other}")));
    // The browser reports the API's 404 itself; nothing else may be logged.
    let errors = console_errors(&c).await;
    assert!(
        errors.iter().all(|e| e.contains("404")),
        "only the refused job's 404: {errors:#?}"
    );
    // And the token is nowhere but session storage.
    let url = c.current_url().await.expect("url");
    assert!(!url.as_str().contains(VISION_TOKEN));
    let stored = c
        .execute("return [sessionStorage.getItem('gpusched.token'), localStorage.length, document.cookie];", vec![])
        .await
        .expect("storage");
    assert_eq!(stored, json!([VISION_TOKEN, 0, ""]));

    c.close().await.expect("close the browser");
    stack::teardown(stack).await;
}
