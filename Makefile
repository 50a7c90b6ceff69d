# The two set-up commands of README.md.  Both install into ./.venv first (idempotent).
.PHONY: serve test install install-test

install:
	bash launch/install.sh

install-test:
	bash launch/install.sh test

serve: install
	bash launch/serve_demo.sh

test: install-test
	bash launch/run_tests.sh
