#!/usr/bin/env bash
# Stand-in for the official python:3.11-slim-bookworm images, which no registry serves here: Debian bookworm
# (debootstrap minbase from the host's own apt mirror) + Debian's python3 (3.11), pip, venv, `python` on PATH,
# imported with buildah and tagged under the names the Dockerfiles' FROM lines use.
# Usage: base.sh TAG...   (e.g. docker.io/library/python:3.11.14-slim-bookworm); prints the image id.
# Test-only differences from the official image: Debian's python (3.11.2) in /usr instead of python.org's in
# /usr/local, no PEP 668 EXTERNALLY-MANAGED marker (the official image has none), /etc/pip.conf pointing pip at
# the system CA bundle (the builds bind-mount the host's bundle there, so pip reaches PyPI through its proxy).
set -euo pipefail
(($#)) || { echo "usage: $0 TAG..." >&2; exit 2; }
PACKAGES=python3,python3-pip,python3-venv,python-is-python3,ca-certificates
# The host's Debian mirror (deb822 or one-line sources), so the build goes through the same proxy as apt.
mirror=$(sed -n 's/^URIs:[[:space:]]*\(\S*\/debian\)\/*$/\1/p; s/^deb[[:space:]]\+\(http\S*\/debian\)\/*[[:space:]].*/\1/p' \
  /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
rootfs=$(mktemp -d /var/tmp/rtj-base.XXXXXX)
ctr=""
cleanup() { [[ -z $ctr ]] || buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$rootfs"; }
trap cleanup EXIT
echo ">> debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$rootfs" "$mirror" >&2
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$rootfs/etc/pip.conf"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/log/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
ctr=$(buildah from scratch)
tar -C "$rootfs" -c . | buildah add "$ctr" - / >/dev/null 2>&1 || {
  # older buildah cannot read stdin: add the tree through the container's mount instead
  mnt=$(buildah mount "$ctr"); cp -a "$rootfs"/. "$mnt"/; buildah umount "$ctr" >/dev/null; }
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
  --cmd python3 --label org.opencontainers.image.description="rtj stand-in for $1" "$ctr"
id=$(buildah commit --quiet --rm "$ctr" "$1"); ctr=""
for tag in "${@:2}"; do buildah tag "$id" "$tag"; done
echo "$id"
