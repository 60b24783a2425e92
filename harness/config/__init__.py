from harness.config.load import ConfigError, ResolvedRecipe, load_recipe  # noqa: F401
