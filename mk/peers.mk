# Peers: programs written by others that specs test luagent against, pinned
# in peers/package.json and installed with npm into the git-ignored .peers/.
# Included by the Makefile. Without node or npm `make peers` says so and
# succeeds: the specs that need peers then report themselves skipped. The
# stamp is touched only after a successful install, so a second run is a
# no-op until peers/package.json changes.

PEERS_DIR   := .peers
PEERS_STAMP := $(PEERS_DIR)/.installed

.PHONY: peers

peers: $(PEERS_STAMP)
	@:

$(PEERS_STAMP): peers/package.json
	@if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then \
	  echo "make peers: skipped: node and npm are needed (specs that use peers will be skipped)"; \
	  exit 0; \
	fi; \
	echo "make peers: npm install into $(PEERS_DIR)/ from peers/package.json"; \
	mkdir -p $(PEERS_DIR) && \
	cp peers/package.json $(PEERS_DIR)/package.json && \
	npm install --prefix $(PEERS_DIR) --no-audit --no-fund && \
	touch $@
