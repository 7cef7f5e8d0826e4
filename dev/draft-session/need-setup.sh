# On the GPU machine, first in every call after device-setup.sh (bash need-setup.sh NAME || exit 1): fails, naming
# the calling script, when /tmp/prompts is not there: the machine started bare (the last was given back).
[ -f /tmp/prompts/manifest.json ] && exit 0
echo "$1: no /tmp/prompts: this machine started bare (the last was given back): run the part calls and" \
    "device-setup.sh again (dev/draft-session/prepare lists them)" >&2
exit 1
