//! `GET /api/v1/me`: who a token is — its name, role and collections, and the profiles it
//! may submit with — so a client (the console) shows each token what it may do.

use crate::{ApiError, AppState, Principal, Role};
use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

/// A profile a token may submit with.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsableProfile {
    pub name: String,
    pub collection: String,
}

/// What `GET /api/v1/me` answers.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Me {
    pub name: String,
    /// `admin`, `submitter` or `processor`.
    pub role: String,
    /// A submitter's collections (`*`: every one).
    pub collections: Vec<String>,
    /// The profiles it may submit with (none for a processor), by name.
    pub profiles: Vec<UsableProfile>,
}

#[utoipa::path(get, path = "/api/v1/me", tag = "service", summary = "Who this token is: its name, role, collections and the profiles it may submit with", responses((status = 200, description = "the token's principal", body = Me), (status = 401, description = "no or unknown token")))]
pub async fn me(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Me>, ApiError> {
    let mut profiles = Vec::new();
    if matches!(p.role, Role::Admin | Role::Submitter) {
        for name in s.ingest.profile_names() {
            // A profile that cannot be read, or is another tenant's, is not offered.
            if let Ok(collection) = p.may_submit_to(&s.ingest, &name) {
                profiles.push(UsableProfile { name, collection });
            }
        }
    }
    let role = match p.role {
        Role::Admin => "admin",
        Role::Submitter => "submitter",
        Role::Processor => "processor",
    };
    Ok(Json(Me {
        name: p.name.clone(),
        role: role.into(),
        collections: p.collections.clone(),
        profiles,
    }))
}
