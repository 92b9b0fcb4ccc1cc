"""Episode session stores: `base` (the contract), `memory` (one process), `redis` (several
workers or replicas; `codec` is its record format, `redis_scripts` its Lua scripts)."""
