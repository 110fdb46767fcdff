# Set in the environment of each mutant's pytest run (tests/mutants/run.py); tests/conftest.py
# reads it to choose the Hypothesis profile.
MUTANT_RUN_ENV = "MUTANT_RUN"
