//! Bearer-token authentication.
//!
//! Owns: the token table (who a token speaks for) and the rules of what a
//! principal may touch. Tokens are never kept in clear: the table holds
//! their BLAKE3 hashes, read from a tokens file (hashes only) and from
//! `GPUSCHED_ADMIN_TOKEN` (hashed at start).
//!
//! Must never: log or echo a token, or let a tenant token reach another
//! tenant's jobs (those answer 404, as if the job did not exist, so ids
//! cannot be probed).

use std::collections::HashMap;
use std::path::Path;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::Deserialize;

use crate::answers::Unauthorized;
use crate::{ApiError, Gateway};

/// Where the API's bearer tokens come from (flags or env).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct AuthArgs {
    /// Admin token, in clear (hashed at start; never logged).
    #[arg(long, env = "GPUSCHED_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Tokens file: TOML `[[tokens]]` entries with `blake3` hashes and a
    /// `tenant` or `admin = true` (docs/api.md).
    #[arg(long, env = "GPUSCHED_TOKENS_FILE")]
    pub tokens_file: Option<std::path::PathBuf>,
}

impl AuthArgs {
    /// The token table these arguments name (possibly empty).
    pub fn tokens(&self) -> Result<Tokens, AuthConfigError> {
        let mut t = Tokens::none();
        if let Some(tok) = self.admin_token.as_deref().filter(|t| !t.is_empty()) {
            t = t.with_token(tok, Principal::Admin);
        }
        if let Some(p) = self
            .tokens_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            t = t.with_file(p)?;
        }
        Ok(t)
    }
}

/// Who a request speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// Manages tenants and nodes; reads and cancels every job.
    Admin,
    /// Submits, reads and cancels its own tenant's jobs only.
    Tenant(String),
}

impl Principal {
    /// Whether this principal may see and act on a job of `tenant`.
    pub fn may_touch(&self, tenant: &str) -> bool {
        match self {
            Principal::Admin => true,
            Principal::Tenant(t) => t == tenant,
        }
    }

    /// Fails unless this is the admin.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Tenant(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this needs the admin token",
            )),
        }
    }
}

/// The hash a token is stored under: BLAKE3, lowercase hex.
pub fn hash_token(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

/// A tokens file: `[[tokens]]` entries with a hash and who they speak for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    /// A label for logs (never the token).
    #[serde(default)]
    name: Option<String>,
    /// The tenant the token acts for; absent with `admin = true`.
    #[serde(default)]
    tenant: Option<String>,
    /// Whether the token is an admin token.
    #[serde(default)]
    admin: bool,
    /// BLAKE3 of the token, hex (`gpusched token hash`).
    blake3: String,
}

/// Why the token table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// The tokens file could not be read.
    #[error("tokens file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The tokens file is not valid.
    #[error("tokens file {path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong, naming the field.
        message: String,
    },
}

/// The token table.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    by_hash: HashMap<String, Principal>,
}

impl Tokens {
    /// No tokens: every request is refused with 401.
    pub fn none() -> Self {
        Tokens::default()
    }

    /// Adds a token given in clear (e.g. `GPUSCHED_ADMIN_TOKEN`).
    pub fn with_token(mut self, token: &str, who: Principal) -> Self {
        self.by_hash.insert(hash_token(token), who);
        self
    }

    /// Adds the entries of a tokens file.
    pub fn with_file(mut self, path: &Path) -> Result<Self, AuthConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| AuthConfigError::Read {
            path: p.clone(),
            source,
        })?;
        let file: TokensFile = toml::from_str(&text).map_err(|e| AuthConfigError::Invalid {
            path: p.clone(),
            message: e.to_string(),
        })?;
        for (i, t) in file.tokens.into_iter().enumerate() {
            let bad = |m: &str| AuthConfigError::Invalid {
                path: p.clone(),
                message: format!("tokens[{i}]: {m}"),
            };
            let hash = t.blake3.trim().to_ascii_lowercase();
            if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad("blake3: must be 64 hex digits (gpusched token hash)"));
            }
            let who = match (t.admin, t.tenant) {
                (true, None) => Principal::Admin,
                (false, Some(tenant)) if !tenant.trim().is_empty() => Principal::Tenant(tenant),
                (true, Some(_)) => return Err(bad("tenant: an admin token names no tenant")),
                _ => return Err(bad("tenant: required unless admin = true")),
            };
            tracing::debug!(name = t.name.as_deref().unwrap_or(""), ?who, "token loaded");
            self.by_hash.insert(hash, who);
        }
        Ok(self)
    }

    /// How many tokens are known.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether no token is known.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Who a bearer token speaks for.
    pub fn principal(&self, token: &str) -> Option<&Principal> {
        self.by_hash.get(&hash_token(token))
    }
}

impl FromRequestParts<Gateway> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Gateway) -> Result<Self, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let Some(h) = parts.headers.get(axum::http::header::AUTHORIZATION) else {
            return Err(unauthorized("missing Authorization: Bearer <token>"));
        };
        let token = h
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("Authorization: must be `Bearer <token>`"))?;
        gw.tokens
            .principal(token)
            .cloned()
            .ok_or_else(|| unauthorized("unknown token"))
    }
}

/// `GET /v1/whoami`'s answer: who the token speaks for.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// Whether the token is the admin's (sees and acts on every tenant).
    admin: bool,
    /// The tenant a tenant token acts for; `null` for the admin.
    tenant: Option<String>,
}

/// Who the bearer token speaks for (the dashboard scopes itself by it).
#[utoipa::path(get, path = "/v1/whoami", tag = "cluster",
    responses((status = 200, body = WhoAmI), Unauthorized),
    security(("bearer" = [])))]
pub async fn whoami(who: Principal) -> axum::Json<WhoAmI> {
    axum::Json(match who {
        Principal::Admin => WhoAmI {
            admin: true,
            tenant: None,
        },
        Principal::Tenant(t) => WhoAmI {
            admin: false,
            tenant: Some(t),
        },
    })
}
