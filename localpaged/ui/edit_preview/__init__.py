"""The cost preview under a chat tab's Edit box: what the edited branch will reuse from the KV
prefix cache and what it must prefill."""
