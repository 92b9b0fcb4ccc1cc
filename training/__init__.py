"""Everything that imports torch: collection, datasets, learning, export, evaluation.

Imports run one way (the rule is `MAY_IMPORT` in tests/test_import_rules.py); each part may
import the parts listed before it, except where noted:
    provenance, pid_lagrangian   shared helpers: nothing from training
    data/                        datasets, frontiers, windows
    collect/                     data (not learn)
    learn/                       data (not collect)
    export, card_update          learn, data
    baselines/                   export, data (not learn or evaluation)
    evaluation/                  export, learn, data (not baselines)
    pipeline, report/, train_cli the orchestrators: wire the others together
Nothing here imports service/ or clients/; what training shares with them lives in runtime/.
"""
