//! Parameter paths as checkpoints name them, built while Burn walks a module: field
//! names joined by dots, enum variants left out (`model.layers.0.self_attn.q_proj.weight`,
//! not `….self_attn.MultiHead.q_proj.weight`). Every visitor and mapper that names
//! parameters (loading, export, adapters, freezing) keeps its path here.

/// The path of the parameter being visited, and the module types around it.
#[derive(Debug, Default)]
pub(crate) struct ParamPath {
    names: Vec<String>,
    containers: Vec<String>,
}

impl ParamPath {
    /// Call from `enter_module`.
    pub fn enter(&mut self, name: &str, container_type: &str) {
        self.containers.push(container_type.to_string());
        // Enum variants are not part of checkpoint keys.
        if !container_type.starts_with("Enum:") {
            self.names.push(name.to_string());
        }
    }

    /// Call from `exit_module`.
    pub fn exit(&mut self, container_type: &str) {
        self.containers.pop();
        if !container_type.starts_with("Enum:") {
            self.names.pop();
        }
    }

    /// The dotted path.
    pub fn joined(&self) -> String {
        self.names.join(".")
    }

    /// The name of the module holding the parameter (`q_proj` of `….q_proj.weight`).
    pub fn layer_name(&self) -> Option<&str> {
        let len = self.names.len();
        (len >= 2).then(|| self.names[len - 2].as_str())
    }

    /// Whether the parameter is the weight of a linear layer, which Burn stores
    /// `[in, out]` and PyTorch `[out, in]`.
    pub fn is_linear_weight(&self) -> bool {
        let in_linear = self
            .containers
            .iter()
            .rev()
            .find(|c| c.starts_with("Struct:") || c.starts_with("Enum:"))
            .is_some_and(|c| c == "Struct:Linear");
        in_linear && self.names.last().is_some_and(|name| name == "weight")
    }
}
