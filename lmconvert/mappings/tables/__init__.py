"""The table machinery every family is written in: config.json keys (`hf_config`, `config_table`, and the
shared rows for RoPE, layer kinds, experts and aliases) and tensor names (`table`, `transforms`)."""
