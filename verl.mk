# The verl environment, for `include verl.mk` in the Makefile.
#   make verl-venv   build .venv-verl (verl==0.9.1, CPU torch, zarr_skip editable); a no-op when current
#   make test-verl   verl-venv, then pytest tests/verl_integration in it
# Both call scripts/verl_env.sh, which keeps a stamp (hash of requirements-verl.txt + pyproject.toml).
VERL_VENV ?= .venv-verl

.PHONY: verl-venv test-verl

verl-venv:
	PYTHON=$(or $(PYTHON),python3) VERL_VENV=$(VERL_VENV) bash scripts/verl_env.sh venv

test-verl:
	PYTHON=$(or $(PYTHON),python3) VERL_VENV=$(VERL_VENV) bash scripts/verl_env.sh test
