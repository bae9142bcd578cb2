//! `gpusched tenants apply FILE`: creates or replaces tenants from a TOML
//! file of `[[tenant]]` tables (the format of a cluster file's tenants,
//! so a cluster file works as is), through `PUT /v1/tenants/{name}`, then
//! sets the cohorts its `[[cohort]]` tables describe (`PUT
//! /v1/cohorts/{name}`). `gpusched tenants budget TENANT FLAVOR` sets or
//! removes one GPU-hour budget (`PUT`/`DELETE
//! /v1/tenants/{name}/budgets/{flavor}`).
//!
//! Owns: reading and checking the file, and the budget's flags, before
//! anything is sent.
//!
//! Must never: send anything from a file with an error in it (every
//! tenant is checked first), or guess a tenant the file does not name.

use std::path::PathBuf;

use anyhow::Result;
use gpusched_model::{
    Budget, BudgetPeriod, CohortSpec, TenantSpec, WhenSpent, MAX_BUDGET_GPU_HOURS,
};
use serde::Deserialize;

use crate::client::{exit, fail, Conn};

/// `gpusched tenants`.
#[derive(clap::Subcommand, Debug)]
pub enum TenantsCmd {
    /// Create or replace every tenant a TOML file's `[[tenant]]` tables
    /// describe, then set each cohort its `[[cohort]]` tables describe (a
    /// cluster file works: its other sections are left alone).
    Apply {
        /// The file.
        file: PathBuf,
        #[command(flatten)]
        conn: Conn,
    },
    /// Set a tenant's GPU-hour budget in one flavor (admin), or remove it
    /// with `--remove`. Past it, its jobs there wait for the next period
    /// (`--when-spent wait`) or run only on quota the cohort lends
    /// (`borrow-only`); jobs already running run on.
    Budget {
        /// The tenant.
        tenant: String,
        /// A flavor it has a quota in.
        flavor: String,
        /// GPU-hours per period (GPUs held × hours, admission to release).
        #[arg(long, required_unless_present = "remove",
            value_parser = clap::value_parser!(u64).range(1..=MAX_BUDGET_GPU_HOURS))]
        gpu_hours: Option<u64>,
        /// The calendar period it renews on (UTC).
        #[arg(long, value_enum, default_value = "month")]
        period: PeriodArg,
        /// What its jobs do once it is spent.
        #[arg(long, value_enum, default_value = "wait")]
        when_spent: WhenSpentArg,
        /// Remove the budget instead.
        #[arg(long, conflicts_with_all = ["gpu_hours"])]
        remove: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `--period`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum PeriodArg {
    /// From 00:00 UTC each day.
    Day,
    /// From Monday 00:00 UTC.
    Week,
    /// From the first of the month, 00:00 UTC.
    Month,
}

/// `--when-spent`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum WhenSpentArg {
    /// Its jobs wait for the next period.
    Wait,
    /// Its jobs run only on quota the cohort lends, first to be reclaimed.
    BorrowOnly,
}

fn budget_of(gpu_hours: u64, period: PeriodArg, when_spent: WhenSpentArg) -> Budget {
    Budget {
        gpu_hours,
        period: match period {
            PeriodArg::Day => BudgetPeriod::Day,
            PeriodArg::Week => BudgetPeriod::Week,
            PeriodArg::Month => BudgetPeriod::Month,
        },
        when_spent: match when_spent {
            WhenSpentArg::Wait => WhenSpent::Wait,
            WhenSpentArg::BorrowOnly => WhenSpent::BorrowOnly,
        },
    }
}

#[derive(Deserialize)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantSpec>,
    #[serde(default)]
    cohort: Vec<CohortSpec>,
}

/// The file's tenants and cohorts, checked; an error names the file and
/// the field.
fn read(file: &PathBuf) -> Result<(Vec<TenantSpec>, Vec<CohortSpec>)> {
    let shown = file.display();
    let text =
        std::fs::read_to_string(file).map_err(|e| fail(exit::USAGE, format!("{shown}: {e}")))?;
    let parsed: TenantsFile =
        toml::from_str(&text).map_err(|e| fail(exit::USAGE, format!("{shown}: {e}")))?;
    if parsed.tenant.is_empty() && parsed.cohort.is_empty() {
        return Err(fail(
            exit::USAGE,
            format!("{shown}: no [[tenant]] or [[cohort]] table"),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, t) in parsed.tenant.iter().enumerate() {
        t.check_new().map_err(|e| {
            fail(
                exit::USAGE,
                format!("{shown}: tenant[{i}].{}: {}", e.field, e.rule),
            )
        })?;
        if !seen.insert(t.name.clone()) {
            return Err(fail(
                exit::USAGE,
                format!("{shown}: tenant {} is listed twice", t.name),
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, c) in parsed.cohort.iter().enumerate() {
        c.check_fields().map_err(|e| {
            fail(
                exit::USAGE,
                format!("{shown}: cohort[{i}].{}: {}", e.field, e.rule),
            )
        })?;
        if !seen.insert(c.name.clone()) {
            return Err(fail(
                exit::USAGE,
                format!("{shown}: cohort {} is listed twice", c.name),
            ));
        }
    }
    Ok((parsed.tenant, parsed.cohort))
}

/// `gpusched tenants ...`.
pub async fn tenants(cmd: TenantsCmd) -> Result<()> {
    match cmd {
        TenantsCmd::Apply { file, conn } => apply(&file, conn).await,
        TenantsCmd::Budget {
            tenant,
            flavor,
            gpu_hours,
            period,
            when_spent,
            remove,
            conn,
        } => {
            let c = conn.client()?;
            let path = format!("/v1/tenants/{tenant}/budgets/{flavor}");
            match gpu_hours.filter(|_| !remove) {
                None => {
                    c.delete(&path).await?;
                    println!("tenant {tenant}: no budget in {flavor}");
                }
                Some(h) => {
                    let b = budget_of(h, period, when_spent);
                    c.put_json(&path, &b).await?;
                    println!(
                        "tenant {tenant}: {h} GPU-hours of {flavor} a {}, then {}",
                        b.period.name(),
                        b.when_spent.name()
                    );
                }
            }
            Ok(())
        }
    }
}

/// `gpusched tenants apply FILE`.
async fn apply(file: &PathBuf, conn: Conn) -> Result<()> {
    let (tenants, cohorts) = read(file)?;
    let c = conn.client()?;
    for t in &tenants {
        let path = format!("/v1/tenants/{}", t.name);
        let (status, _) = c.put_json(&path, t).await.map_err(|e| {
            let applied = tenants.iter().take_while(|x| x.name != t.name).count();
            e.context(format!("tenant {} ({applied} before it applied)", t.name))
        })?;
        let what = if status == 201 { "created" } else { "replaced" };
        println!("tenant {}: {what}", t.name);
    }
    for co in &cohorts {
        let path = format!("/v1/cohorts/{}", co.name);
        c.put_json(&path, co).await.map_err(|e| {
            e.context(format!(
                "cohort {} (every tenant and the cohorts before it applied)",
                co.name
            ))
        })?;
        println!(
            "cohort {}: usage half-life {} s",
            co.name, co.usage_half_life_s
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("tenants.toml");
        std::fs::write(&p, text).expect("write");
        (d, p)
    }

    #[test]
    fn a_bad_file_names_the_file_and_the_field_and_sends_nothing() {
        let (_d, p) = file("[[tenant]]\nname = \"a\"\nweight = 0.0\n");
        let e = read(&p).expect_err("weight 0 is refused").to_string();
        assert!(
            e.contains("tenants.toml") && e.contains("tenant[0].weight"),
            "{e}"
        );
        let (_d, p) = file("[[tenant]]\nname = \"a\"\ncolour = 1\n");
        let e = read(&p).expect_err("unknown field").to_string();
        assert!(e.contains("colour"), "{e}");
        let (_d, p) = file("[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\n");
        assert!(read(&p)
            .expect_err("twice")
            .to_string()
            .contains("listed twice"));
        let (_d, p) = file("[topology]\nlevels = []\n");
        assert!(read(&p)
            .expect_err("none")
            .to_string()
            .contains("no [[tenant]] or [[cohort]]"));
        let (_d, p) = file("[[cohort]]\nname = \"c\"\nusage_half_life_s = 316224001\n");
        let e = read(&p).expect_err("too long").to_string();
        assert!(e.contains("cohort[0].usage_half_life_s"), "{e}");
    }

    #[test]
    fn a_cluster_file_gives_its_tenants() {
        let text = include_str!("../../docs/clusters/demo.toml");
        let (_d, p) = file(text);
        let names: Vec<String> = read(&p)
            .expect("the demo cluster")
            .0
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["vision", "language", "speech"]);
    }
}
