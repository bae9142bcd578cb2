//! `gpusched cohorts`: each cohort's usage half-life and its members in the
//! order borrowable quota goes to them (`GET /v1/cohorts`), and `gpusched
//! cohorts set NAME --usage-half-life 7d` (`PUT /v1/cohorts/{name}`).
//!
//! Owns: reading a half-life as the user writes it, and the words and
//! table these commands print. Must never: decide the order (the gateway
//! reports the quota stage's), or send a change it could not read.

use anyhow::Result;
use gpusched_model::{CohortSpec, MAX_USAGE_HALF_LIFE_S};
use serde_json::Value;

use crate::client::{table, Conn};

/// `gpusched cohorts`.
#[derive(clap::Args, Debug)]
pub struct CohortsArgs {
    #[command(subcommand)]
    op: Option<CohortOp>,
    #[command(flatten)]
    conn: Conn,
}

/// `gpusched cohorts ...`: a change to one cohort.
#[derive(clap::Subcommand, Debug)]
pub enum CohortOp {
    /// Set a cohort's usage half-life (admin): borrowers are then served
    /// lowest decayed use per weight first; `0` serves them by the share
    /// they borrow now.
    Set {
        /// The cohort.
        name: String,
        /// After how long past use counts half: seconds, or a number with
        /// `s`, `m`, `h`, `d` or `w` (e.g. `6h`, `7d`).
        #[arg(long, value_parser = half_life)]
        usage_half_life: u64,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Reads `90`, `90s`, `30m`, `6h`, `7d` or `2w` as seconds (at most ten years).
pub fn half_life(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: a whole number with an optional unit (s, m, h, d, w)"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (s, m, h, d or w)"
            ))
        }
    };
    n.checked_mul(scale)
        .filter(|s| *s <= MAX_USAGE_HALF_LIFE_S)
        .ok_or_else(|| format!("{text:?}: at most ten years"))
}

/// A number of seconds the way `half_life` reads it back.
fn half_life_text(s: u64) -> String {
    match s {
        0 => "-".to_string(),
        s if s % 604_800 == 0 => format!("{}w", s / 604_800),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// `gpusched cohorts [set ...]`.
pub async fn cohorts(a: CohortsArgs) -> Result<()> {
    if let Some(CohortOp::Set {
        name,
        usage_half_life,
        conn,
    }) = a.op
    {
        let spec = CohortSpec {
            name: name.clone(),
            usage_half_life_s: usage_half_life,
        };
        let c = conn.client()?;
        let (_, v) = c.put_json(&format!("/v1/cohorts/{name}"), &spec).await?;
        if c.json {
            c.print_json(&v);
        } else {
            println!(
                "cohort {name}: usage half-life {}",
                half_life_text(usage_half_life)
            );
        }
        return Ok(());
    }
    let c = a.conn.client()?;
    let v = c.get("/v1/cohorts").await?;
    if c.json {
        c.print_json(&v);
        return Ok(());
    }
    println!("{}", cohorts_table(&v));
    Ok(())
}

/// `GET /v1/cohorts`'s answer as `gpusched cohorts` prints it: one row per
/// member, in the order each cohort serves its borrowers.
pub fn cohorts_table(v: &Value) -> String {
    let text = |x: &Value, k: &str| x.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let mut rows = Vec::new();
    for c in v
        .get("cohorts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let half_life = c
            .get("usage_half_life_s")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        for m in c
            .get("members")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let decayed: Vec<String> = m
                .get("decayed_gpus")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(flavor, g)| format!("{:.1} {flavor}", g.as_f64().unwrap_or(0.0)))
                .collect();
            rows.push(vec![
                text(c, "name"),
                half_life_text(half_life),
                m.get("place")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
                    .to_string(),
                text(m, "tenant"),
                m.get("weight")
                    .and_then(Value::as_f64)
                    .unwrap_or(1.0)
                    .to_string(),
                format!(
                    "{:.3}",
                    m.get("share").and_then(Value::as_f64).unwrap_or(0.0)
                ),
                if decayed.is_empty() {
                    "-".to_string()
                } else {
                    decayed.join(", ")
                },
            ]);
        }
    }
    table(
        &[
            "COHORT",
            "HALF_LIFE",
            "PLACE",
            "TENANT",
            "WEIGHT",
            "SHARE",
            "DECAYED_GPUS",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_life_reads_with_or_without_a_unit_and_bad_ones_say_why() {
        assert_eq!(half_life("90"), Ok(90));
        assert_eq!(half_life("6h"), Ok(21_600));
        assert_eq!(half_life("7d"), Ok(604_800));
        assert_eq!(half_life("0"), Ok(0));
        assert!(half_life("7y").unwrap_err().contains("unknown unit"));
        assert!(half_life("h").unwrap_err().contains("whole number"));
        assert!(half_life("-1").unwrap_err().contains("whole number"));
        assert!(half_life("11000d").unwrap_err().contains("ten years"));
        assert_eq!(half_life_text(604_800), "1w");
        assert_eq!(half_life_text(21_600), "6h");
        assert_eq!(half_life_text(90), "90s");
    }
}
