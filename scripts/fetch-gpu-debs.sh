#!/bin/sh
# fetch-gpu-debs.sh — downloads (apt-get download, no root needed) the Debian 12 packages
# ddpd builds and runs against, and unpacks them (dpkg -x) into .gpu-debs/root, for a GPU
# machine that has CUDA, NCCL and PyTorch but no package registry: carry .gpu-debs there
# and scripts/gpu-check.sh builds against it. Run it here, where apt works.
#   scripts/fetch-gpu-debs.sh [--unpack-only] [DIR]   (default: .gpu-debs in the repository)
# --unpack-only skips the download and unpacks DIR/debs again (on the GPU machine, where
# only the .deb files, 22 MB, need to travel).
set -eu
cd "$(dirname "$0")/.."
FETCH=1
if [ "${1:-}" = "--unpack-only" ]; then
    FETCH=0
    shift
fi
DIR=${1:-.gpu-debs}

# jansson, OpenBLAS (pthread flavour, and the gfortran runtime it links), libmicrohttpd
# (with GnuTLS, and the -dev packages whose .pc files its pkg-config file requires),
# SQLite, PCRE2 (the tokenizer's pattern: the 8-bit library, and the other three whose
# links libpcre2-dev holds).
PKGS="libjansson4 libjansson-dev
libopenblas0 libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5 libquadmath0
libmicrohttpd12 libmicrohttpd-dev libgnutls30 libgnutls28-dev libnettle8 libhogweed6 nettle-dev
libgmp10 libtasn1-6 libtasn1-6-dev libidn2-0 libidn2-dev libunistring2 libp11-kit0 libp11-kit-dev
libffi8
libsqlite3-0 libsqlite3-dev
libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libpcre2-dev"

mkdir -p "$DIR/debs"
rm -rf "$DIR/root"
if [ "$FETCH" = 1 ]; then
    ( cd "$DIR/debs" && apt-get download $PKGS )
fi
mkdir -p "$DIR/root"
for deb in "$DIR"/debs/*.deb; do
    if command -v dpkg >/dev/null; then
        dpkg -x "$deb" "$DIR/root"
    else
        # Without dpkg: a .deb is an ar archive whose data.tar.* holds the files.
        rm -rf "$DIR/ar" && mkdir -p "$DIR/ar"
        (cd "$DIR/ar" && ar x "../debs/$(basename "$deb")")
        tar -xf "$DIR"/ar/data.tar.* -C "$DIR/root"
    fi
done
rm -rf "$DIR/ar"

# OpenBLAS's unversioned names are links into /etc/alternatives, which dpkg -x does not
# create (its postinst does): point them at the pthread flavour inside the tree instead.
LIB="$DIR/root/usr/lib/x86_64-linux-gnu"
INC="$DIR/root/usr/include/x86_64-linux-gnu"
find "$DIR/root" -type l -lname '/etc/alternatives/*' -delete
ln -sf openblas-pthread/libopenblas.so.0 "$LIB/libopenblas.so.0"
ln -sf openblas-pthread/libopenblas.so "$LIB/libopenblas.so"
ln -sf openblas-pthread/libblas.so.3 "$LIB/libblas.so.3"
ln -sf ../openblas-pthread/pkgconfig/openblas.pc "$LIB/pkgconfig/openblas.pc"
ln -sf openblas-pthread/cblas.h "$INC/cblas.h"

echo "fetch-gpu-debs: $(ls "$DIR"/debs/*.deb | wc -l) packages unpacked into $DIR/root ($(du -sh "$DIR/root" | cut -f1))"
