"""The cost-model chain as a user runs it: the demo's steps per backend (`demo`), the artifacts into
and out of the cost model (`prediction`, `versions`)."""
