"""The pipeline config: the TOML file read, validated and typed, the stage names it implies,
and the checks ``run`` makes of the machine before anything starts."""
