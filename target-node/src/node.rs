//! The target node's state: the model on its worker thread and the open sessions.

use std::path::PathBuf;
use std::sync::Arc;

use specd_model::{DType, DeviceSpec, LoadOptions, NodeModel, NodeSessionState, SessionId};
use specd_sampling::SamplingParams;

use crate::error::TargetError;
use crate::verify::{TargetState, Verified, VerifyJob, verify};

/// How to run a target node.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// A Hugging Face checkpoint directory or a table-model JSON file.
    pub model: PathBuf,
    pub device: DeviceSpec,
    pub dtype: DType,
    /// Sessions open at once; more are refused with RESOURCE_EXHAUSTED.
    pub max_sessions: usize,
    /// Bytes of KV cache all sessions may hold; `None` is unbounded.
    pub kv_budget_bytes: Option<u64>,
}

impl NodeSessionState for TargetState {
    fn model_session(&self) -> SessionId {
        self.model_session
    }
}

/// A loaded target model and its sessions. Cheap to clone: the state is shared.
#[derive(Debug, Clone)]
pub struct TargetNode {
    pub(crate) model: NodeModel<TargetState>,
    pub(crate) config: Arc<TargetConfig>,
}

impl TargetNode {
    /// Loads the model on its own worker thread; blocks until it is ready.
    pub fn load(config: TargetConfig) -> Result<Self, TargetError> {
        let options = LoadOptions { device: config.device, dtype: config.dtype, memory_budget: config.kv_budget_bytes };
        let model = NodeModel::load("specd-target-model", &config.model, options, config.max_sessions)?;
        Ok(Self { model, config: Arc::new(config) })
    }

    pub async fn open_session(
        &self,
        session_id: String,
        prompt: Vec<u32>,
        params: SamplingParams,
        seed: u64,
    ) -> Result<(), TargetError> {
        let build = |model_session, history| TargetState { model_session, history, params, seed };
        Ok(self.model.open(session_id, prompt, build).await?)
    }

    pub async fn verify(&self, session_id: &str, job: VerifyJob) -> Result<Verified, TargetError> {
        self.model.run(session_id, move |m, state| verify(m, state, &job)).await?
    }

    /// Releases the session; `false` when it was not open.
    pub async fn release(&self, session_id: &str) -> Result<bool, TargetError> {
        Ok(self.model.release(session_id).await?)
    }
}
