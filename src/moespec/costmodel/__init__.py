"""Pure math of the cost-model paper: numbers in, numbers out. Imports neither torch nor transformers."""
