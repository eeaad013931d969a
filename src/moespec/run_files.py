"""The files of a run folder, each named once: every artifact `moespec demo` and `moespec batch` write,
and the kind its header names (`artifacts.load` checks it).

The steps that write them and the runner that reuses, sets aside and restarts them are in
`chain.run_folder`; the report reads the same names (`report.build`).
"""

from __future__ import annotations

# the chain at B = 1 (`chain.demo`)
TRACES = "traces.parquet"
TRAINED_ROUTING = "trained-routing.parquet"  # `--routing trained`: what trained:olmoe chose on the corpus
VERIFIED = "verified.parquet"
CHARACTERIZATION = "characterization.json"
DENSE_CHARACTERIZATION = "dense-characterization.json"  # a dense file's D(n) and R_d(n) (`chain.dense_chain`)
MEASUREMENT_BASE = "measurement-base.json"
MEASUREMENT = "measurement.json"
POINTS = "measurement.points.jsonl"  # the point log that both measure phases share
PREDICTION = "prediction.json"
SCORE = "score.json"
# the chain at batch size B (`chain.batch_chain`)
BATCH_TRACES = "batch-traces.parquet"
BATCH_CHARACTERIZATION = "batch-characterization.json"
BATCH_MEASUREMENT = "batch-measurement.json"
BATCH_PREDICTION = "batch-prediction.json"
BATCH_SCORE = "batch-score.json"
SCHEDULE = "schedule.png"  # Figure 7
# the user's candidate drafts (`chain.candidate_steps`): the prompts' two halves, each candidate's
# calibration and held-out check (CANDIDATE + index + suffix), the answer over them and its score
PROMPTS = "prompts.json"
CANDIDATE = "candidate-"
CALIBRATION_SUFFIX, CHECK_SUFFIX = "-calibration.json", "-check.json"
BATCH_COST_SUFFIX, BATCH_COST_KIND = "-batch-cost.json", "candidate-batch-cost"  # a draft's h_B(k)
PASSES = "candidate-passes.json"  # the target's passes on the calibration half as decoding meets them
CANDIDATES = "candidates.json"
CANDIDATES_SCORE = "candidates-score.json"
CANDIDATES_LLAMA = "candidates-llama.json"  # llama.cpp's own speculative decoding of the held-out half
CANDIDATES_FIGURE = "candidates.png"  # predicted against measured speedup per candidate and k
# the report (`report.build`) and the steps' peak memory (`chain.run_folder`)
REPORT = "report.html"
SUMMARY = "summary.txt"
ANSWER = "answer.txt"  # the answer alone (`report.answer`), also the head of summary.txt
MEMORY = "memory.json"
LLAMA_FOLDER = "llama.cpp"  # where `moespec demo --backend llama.cpp` runs, inside the torch run folder

PARTIAL = ".partial"  # a half-written artifact, resumed by the step that writes it
OLD = ".old"  # an artifact set aside by a restart

KINDS = {CHARACTERIZATION: "characterize", DENSE_CHARACTERIZATION: "characterize-dense", MEASUREMENT_BASE: "measure", MEASUREMENT: "measure",
         PREDICTION: "predict", SCORE: "score", BATCH_CHARACTERIZATION: "characterize",
         BATCH_MEASUREMENT: "batch-measure", BATCH_PREDICTION: "batch-predict", BATCH_SCORE: "batch-score",
         MEMORY: "memory", PROMPTS: "prompts", CANDIDATES: "candidates", CANDIDATES_SCORE: "candidates-score",
         CANDIDATES_LLAMA: "candidates-llama", PASSES: "candidate-passes"}
CALIBRATION_KIND, CHECK_KIND = "candidate-calibration", "candidate-check"
# the files a restart moves aside, with any point log (the routing a model replays and an export stay:
# they are inputs of the model, not of this run)
RESTARTED = (TRACES, VERIFIED, *KINDS, BATCH_TRACES, SCHEDULE, CANDIDATES_FIGURE, REPORT, SUMMARY, ANSWER)


def calibration_file(index: int) -> str:
    """The calibration of the candidate at `index` (its order on the command line)."""
    return f"{CANDIDATE}{index}{CALIBRATION_SUFFIX}"


def check_file(index: int) -> str:
    """The held-out check of the candidate at `index`."""
    return f"{CANDIDATE}{index}{CHECK_SUFFIX}"
