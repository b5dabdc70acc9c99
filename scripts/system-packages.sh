#!/bin/sh
# The system packages Hearth uses, installed from Debian's apt where missing: one `apt-get update` and one
# `apt-get install` for all the kinds asked (`make test` asks for six; on a fresh machine each of them
# updating and installing on its own cost an update and a dpkg run apiece).
#
#   scripts/system-packages.sh KIND...
#
#   blas      OpenBLAS (and BLIS, a small extra candidate): MLX's Linux CPU wheel links the slow reference
#             BLAS, and `hearth` preloads the fastest library it measures (core/blas.py). Linux only.
#   browser   Chromium, which the dashboard tests drive through Playwright. Linux only.
#   git       memory vaults are git repositories.
#   media     ffmpeg decodes every audio upload; espeak-ng speaks the demo Whisper's training data. Linux only.
#   redis     redis-server: the suite starts its own on a free loopback port (tests/conftest.py).
#   postgres  PostgreSQL: the suite runs the platform on it too (tests/pg.py). Linux only.
#
# Without root or sudo nothing is installed: a missing blas or git is a warning (Hearth measures what is
# there; vaults need git), any other a one-line error and exit status 1.
set -u

linux=0
[ "$(uname -s)" = Linux ] && linux=1
need=""     # Debian packages to install
errors=""   # what is missing and needed: a line each
warnings="" # what is missing and may be left: a line each

missing() { # package severity words
	need="$need $1"
	if [ "$2" = error ]; then errors="${errors}error: $3
"; else warnings="${warnings}warning: $3
"; fi
}

any() { # the first existing path among the arguments
	for f in "$@"; do [ -e "$f" ] && return 0; done
	return 1
}

for kind in "$@"; do
	case "$kind" in
	blas)
		[ $linux = 1 ] || continue
		any /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
			/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3 ||
			missing libopenblas0-pthread warning "OpenBLAS (apt-get install libopenblas0-pthread); Hearth measures what is installed"
		any /usr/lib/x86_64-linux-gnu/blis-pthread/libblas.so.3 \
			/usr/lib/aarch64-linux-gnu/blis-pthread/libblas.so.3 ||
			missing libblis4-pthread warning "BLIS (apt-get install libblis4-pthread); Hearth measures what is installed"
		;;
	browser)
		[ $linux = 1 ] || continue
		command -v chromium >/dev/null ||
			missing chromium error "chromium is needed for the dashboard tests (apt-get install chromium)"
		;;
	git)
		command -v git >/dev/null || missing git warning "git is not installed; memory vaults need it (apt-get install git)"
		;;
	media)
		[ $linux = 1 ] || continue
		for tool in ffmpeg espeak-ng; do
			command -v $tool >/dev/null || missing $tool error "$tool is needed for speech to text (apt-get install $tool)"
		done
		;;
	redis)
		if command -v redis-server >/dev/null; then :
		elif [ $linux = 1 ]; then missing redis-server error "redis-server is needed for the Redis tests (apt-get install redis-server)"
		else echo "error: redis-server is needed for the Redis tests (brew install redis)" >&2; exit 1
		fi
		;;
	postgres)
		[ $linux = 1 ] || continue
		ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null ||
			missing postgresql error "PostgreSQL is needed for the database tests (apt-get install postgresql)"
		;;
	*)
		echo "error: unknown kind '$kind' (blas, browser, git, media, redis, postgres)" >&2; exit 2
		;;
	esac
done

if [ -z "$need" ]; then
	echo "system packages present: $*"
	exit 0
fi

if [ "$(id -u)" = 0 ]; then sudo=""
elif command -v sudo >/dev/null; then sudo=sudo
else
	status=0
	printf '%s%s' "$warnings" "$errors" >&2
	[ -n "$errors" ] && status=1
	exit $status
fi

echo "installing:$need"
install="$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q"
$sudo apt-get update -q || exit 1
# Some releases have no libblis4-pthread: everything else without it, then.
$install $need && exit 0
case " $need " in
*" libblis4-pthread "*) $install $(printf '%s\n' $need | grep -vx libblis4-pthread) ;;
*) exit 1 ;;
esac
