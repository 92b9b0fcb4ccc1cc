"""What training and serving share, free of torch, FastAPI and onnxruntime.

Algorithm 2's episode context (`context`), the one episode loop (`episodes`), the paper's scores
(`scores`), the evaluation protocol (`protocol`) and the simulator wrapper (`sim`). Imports none
of `training/`, `service/` or `clients/`; all three import it.
"""
