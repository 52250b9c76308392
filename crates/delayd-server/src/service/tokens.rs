//! Namespace tokens: created, listed and deleted by the admin.
//!
//! Tokens are replicated state: creating or deleting one is a command through the Raft log,
//! so every node authenticates the same set.

use delayd_core::{query, Command, Reply, TokenRecord};

use super::auth::{new_secret, Principal, Scope};
use super::validate::{check_name, Limit, MAX_DESCRIPTION_BYTES, RATE_LIMIT};
use super::Service;
use crate::error::ServiceError;

/// A token to create.
#[derive(Clone, Debug, Default)]
pub struct NewToken {
    /// Free text for the operator.
    pub description: String,
    /// Most reads per second on each node; 0: no limit.
    pub read_limit: u32,
    /// Most writes per second on each node; 0: no limit.
    pub write_limit: u32,
}

impl Service {
    /// Creates a token for `namespace` and returns it: drawn here and carried in the command,
    /// like every other non-deterministic value.
    pub async fn create_token(
        &self,
        caller: &Principal,
        namespace: &str,
        token: NewToken,
    ) -> Result<String, ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        check_name("namespace", namespace)?;
        let NewToken { description, read_limit, write_limit } = token;
        if description.len() > MAX_DESCRIPTION_BYTES {
            return Err(ServiceError::bad_request(format!(
                "description is longer than {MAX_DESCRIPTION_BYTES} bytes"
            )));
        }
        for (name, limit) in [("read_limit", read_limit), ("write_limit", write_limit)] {
            Limit { name, ..RATE_LIMIT }.check(Some(limit.into()))?;
        }
        let token = new_secret();
        let command = Command::CreateToken {
            token: token.clone(),
            namespace: namespace.to_string(),
            description,
            read_limit,
            write_limit,
        };
        self.write_one(command).await?;
        tracing::info!(namespace, "token created");
        Ok(token)
    }

    /// Deletes a token of `namespace`; `NotFound` when the namespace has no such token.
    pub async fn delete_token(
        &self,
        caller: &Principal,
        namespace: &str,
        token: &str,
    ) -> Result<(), ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        check_name("namespace", namespace)?;
        let command =
            Command::DeleteToken { namespace: namespace.to_string(), token: token.to_string() };
        if matches!(self.write_one(command).await?, Reply::Removed(true)) {
            tracing::info!(namespace, "token deleted");
            Ok(())
        } else {
            Err(ServiceError::NotFound(format!("namespace {namespace:?} has no such token")))
        }
    }

    /// The tokens of `namespace`, ordered by token.
    pub async fn tokens(
        &self,
        caller: &Principal,
        namespace: &str,
    ) -> Result<Vec<(String, TokenRecord)>, ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        check_name("namespace", namespace)?;
        self.read(false, |v| query::tokens(v, Some(namespace))).await
    }
}
