//! `loadtest --smoke` against the real Postgres and NATS on 127.0.0.1: a
//! few hundred jobs through every service as its own process, each run to
//! the end. Asserts completion and no loss, not speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn smoke_run_completes_every_job_and_leaves_nothing_behind() {
    let out = std::env::temp_dir().join(format!("loadtest-smoke-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args([
            "--smoke",
            "--ceiling-rows",
            "2000",
            "--timeout-s",
            "120",
            "--out",
        ])
        .arg(&out)
        .status()
        .expect("running loadtest --smoke");
    let report = std::fs::read_to_string(out.join("report.json")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out);
    assert!(status.success(), "loadtest --smoke failed ({status})");
    let r: serde_json::Value = serde_json::from_str(&report).expect("report.json");
    assert_eq!(r["submitted"], r["jobs"]);
    assert_eq!(r["unbound"], 0);
    // The goodput fold of the log: jobs ran, and every allocated GPU-hour
    // is in exactly one part.
    let g = &r["goodput"];
    let h = |k: &str| g[k].as_f64().unwrap_or(f64::NAN);
    assert!(
        h("allocated_gpu_hours") > 0.0,
        "no GPU-hours allocated: {g}"
    );
    let parts = h("useful_gpu_hours")
        + h("recovery_gpu_hours")
        + h("startup_gpu_hours")
        + h("unsaved_at_end_gpu_hours");
    assert!(
        (parts - h("allocated_gpu_hours")).abs() < 1e-6,
        "parts {parts} != allocated: {g}"
    );
    assert!(r["goodput_by_tenant"]
        .as_object()
        .is_some_and(|t| !t.is_empty()));
    // No residue: the run's database is gone.
    let db = r["database"].as_str().expect("database name").to_string();
    let url = std::env::var("LOADTEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let left: i64 = tokio::runtime::Runtime::new().unwrap().block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
            .bind(&db)
            .fetch_one(&mut c)
            .await
            .unwrap()
    });
    assert_eq!(left, 0, "database {db} left behind");
}
