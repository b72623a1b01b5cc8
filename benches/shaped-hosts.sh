# Sourced by the benches that need two hosts over a slow link: makes two
# network namespaces joined by a veth pair whose both ends tc's token
# bucket shapes to RATE, and removes them (and CLEANUP_EXTRA, if set) on
# exit. Sets $a and $b (the namespaces) and $net (their /24: .1 and .2).
#
#   shaped_hosts PREFIX NET_SECOND_OCTET RATE
shaped_hosts() {
  local prefix=$1 octet=$2 rate=$3 side
  a=${prefix}$$a b=${prefix}$$b
  local da=${prefix:0:2}$$a db=${prefix:0:2}$$b
  net=10.$octet.$((1 + $$ % 250))
  trap 'ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; ${CLEANUP_EXTRA:-true}' EXIT
  ip netns add "$a"; ip netns add "$b"
  ip link add "$da" type veth peer name "$db"
  ip link set "$da" netns "$a"; ip link set "$db" netns "$b"
  ip -n "$a" addr add "$net.1/24" dev "$da"; ip -n "$b" addr add "$net.2/24" dev "$db"
  for side in "$a $da" "$b $db"; do
    set -- $side
    ip -n "$1" link set "$2" up; ip -n "$1" link set lo up
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst 256kb latency 100ms
  done
}
