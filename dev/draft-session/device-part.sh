# On the GPU machine, each part call of dev/draft-session/prepare (one carried .gpucache/pK a call;
# device-setup.sh runs it too, for the last folder): the folder's model parts (partNN) into /tmp/smol and its
# prompt files (pK/prompts/, their paths in the build kept) into /tmp/prompts. A folder may hold either or both;
# folders of earlier calls still on this held machine are copied again, unchanged. device-setup.sh checks the whole.
shopt -s nullglob
mkdir -p /tmp/smol /tmp/prompts || exit 1
for part in .gpucache/p*/part[0-9]*; do cp "$part" /tmp/smol/ || exit 1; done
for dir in .gpucache/p*/prompts; do cp -r "$dir/." /tmp/prompts/ || exit 1; done
echo "so far: $(ls /tmp/smol | grep -c '^part[0-9]') model parts in /tmp/smol, $(find /tmp/prompts -type f | wc -l) files in /tmp/prompts"
