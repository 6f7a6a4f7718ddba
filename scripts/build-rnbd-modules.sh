#!/bin/bash
# scripts/build-rnbd-modules.sh: builds Linux's RTRS and RNBD drivers as out-of-tree modules
# for the kernel the rxe lab boots, so the lab can run the kernel's rnbd-server and
# rnbd-client against ours.
#
# Debian's 6.1 kernel is configured without CONFIG_INFINIBAND_RTRS and CONFIG_BLK_DEV_RNBD.
# This script takes the Debian source and header packages of exactly the lab kernel's
# version (apt-get download; nothing is installed), compiles
#     rtrs-core.ko rtrs-client.ko rtrs-server.ko rnbd-client.ko rnbd-server.ko
# and caches them. Later runs print the cached directory at once.
#
#   scripts/build-rnbd-modules.sh [--kernel-deb FILE] [--out DIR] [--force]
#
#   --kernel-deb FILE  the lab's linux-image package (default: the one rxe-lab cached in
#                      ~/.cache/rxe-lab/kpkg; run the lab once to create it)
#   --out DIR          where the modules go (default: target/rnbd-modules/<kernel release>,
#                      inside the checkout, which the lab VM mounts at the same path)
#   --force            rebuild even if the modules are there
#
# The last line on stdout is the module directory. In the VM load them in this order:
#   insmod rtrs-core.ko; insmod rtrs-server.ko; insmod rtrs-client.ko;
#   insmod rnbd-server.ko; insmod rnbd-client.ko
# (scripts/rnbd-kernel-lab.sh does this). Needs apt-get, dpkg-deb, make, gcc-12, xz; about a
# minute the first time (150 MB of packages, 20 s of compiling on 2 cores).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
kdeb="" out="" force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel-deb) kdeb=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "build-rnbd-modules: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
say() { echo "build-rnbd-modules: $*" >&2; }
fail() { say "$*"; exit 1; }

if [ -z "$kdeb" ]; then
  kdeb=$(ls "${XDG_CACHE_HOME:-$HOME/.cache}"/rxe-lab/kpkg/linux-image-*.deb 2>/dev/null | head -1 || true)
  [ -n "$kdeb" ] || fail "the lab's kernel package is not cached yet: run the lab once (../shared/tools/rxe-lab -- true), or pass --kernel-deb"
fi
[ -f "$kdeb" ] || fail "no such file: $kdeb"
pkgver=$(dpkg-deb -f "$kdeb" Version)                       # 6.1.192-2
pkgname=$(dpkg-deb -f "$kdeb" Package)                      # linux-image-6.1.0-56-amd64
krel=${pkgname#linux-image-}                                # 6.1.0-56-amd64
case "$krel" in *-amd64) ;; *) fail "unexpected kernel package $pkgname (expected linux-image-*-amd64)" ;; esac
abi=${krel%-amd64}                                          # 6.1.0-56
series=$(echo "$krel" | cut -d. -f1-2)
out=${out:-$here/target/rnbd-modules/$krel}
mods="rtrs-core rtrs-client rtrs-server rnbd-client rnbd-server"

complete() { for m in $mods; do [ -f "$out/$m.ko" ] || return 1; done; }
if [ $force = 0 ] && complete; then
  say "already built for $krel"
  echo "$out"
  exit 0
fi
for tool in apt-get make gcc-12 xz; do
  command -v $tool >/dev/null || fail "$tool is missing (apt-get install ${tool/apt-get/apt})"
done

tmp=$(mktemp -d /tmp/rnbd-modules.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"      # apt-get download writes as the _apt user

want="linux-source-$series=$pkgver linux-headers-$krel=$pkgver linux-headers-$abi-common=$pkgver linux-kbuild-$series=$pkgver"
say "fetching $want"
if ! (cd "$tmp" && apt-get download $want >"$tmp/apt.log" 2>&1); then
  apt-get update -qq >/dev/null 2>&1 || true
  (cd "$tmp" && apt-get download $want >"$tmp/apt.log" 2>&1) \
    || fail "apt-get cannot fetch version $pkgver of the kernel source and headers ($(tail -1 "$tmp/apt.log")). The archive may have moved on: rebuild the lab on the current kernel and run this again."
fi

# The headers, unpacked here. Their Makefile includes the common tree by an absolute path
# under /usr/src: point it at our copy.
h="$tmp/headers"
mkdir -p "$h"
for d in "$tmp"/linux-headers-*.deb "$tmp"/linux-kbuild-*.deb; do dpkg-deb -x "$d" "$h"; done
kdir="$h/usr/src/linux-headers-$krel"
sed -i "s|^include .*/linux-headers-$abi-common/Makefile|include $h/usr/src/linux-headers-$abi-common/Makefile|" "$kdir/Makefile"
grep -q "^include $h/" "$kdir/Makefile" || fail "the header package's Makefile has changed layout: $kdir/Makefile"

say "unpacking drivers/infiniband/ulp/rtrs and drivers/block/rnbd"
dpkg-deb --fsys-tarfile "$tmp"/linux-source-*.deb \
  | tar -x -O "./usr/src/linux-source-$series.tar.xz" \
  | tar -xJ -C "$tmp" --wildcards \
      "linux-source-$series/drivers/infiniband/ulp/rtrs/*" \
      "linux-source-$series/drivers/block/rnbd/*"
src="$tmp/linux-source-$series"

# One external module tree with both drivers side by side, so modpost links rnbd to rtrs.
b="$tmp/build"
mkdir -p "$b/rtrs" "$b/rnbd"
cp "$src"/drivers/infiniband/ulp/rtrs/{*.c,*.h,Makefile} "$b/rtrs/"
cp "$src"/drivers/block/rnbd/{*.c,*.h,Makefile} "$b/rnbd/"
# rnbd includes rtrs.h through $(srctree), which a header package does not have.
sed -i 's|-I$(srctree)/drivers/infiniband/ulp/rtrs|-I$(src)/../rtrs|' "$b/rnbd/Makefile"
grep -q 'I$(src)/../rtrs' "$b/rnbd/Makefile" || fail "rnbd's Makefile has changed: fix the include path by hand"
echo 'obj-m += rtrs/ rnbd/' >"$b/Kbuild"

say "compiling against $krel"
make -C "$kdir" M="$b" -j"$(nproc)" \
  CONFIG_INFINIBAND_RTRS=m CONFIG_INFINIBAND_RTRS_CLIENT=m CONFIG_INFINIBAND_RTRS_SERVER=m \
  CONFIG_BLK_DEV_RNBD_CLIENT=m CONFIG_BLK_DEV_RNBD_SERVER=m modules >"$tmp/make.log" 2>&1 \
  || { tail -25 "$tmp/make.log" >&2; fail "the build failed (last lines above)"; }

mkdir -p "$out"
for m in $mods; do
  f=$(find "$b" -name "$m.ko" | head -1)
  [ -n "$f" ] || fail "$m.ko was not built"
  cp "$f" "$out/"
done
printf 'kernel %s (Debian %s), built %s with %s\n' "$krel" "$pkgver" "$(date -u +%FT%TZ)" \
  "$(gcc-12 --version | head -1)" >"$out/BUILD-INFO"
say "built $mods"
echo "$out"
