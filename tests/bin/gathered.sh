#!/bin/sh
# A light instance of a many-instance job: ./gathered.sh DIR [FAILING CODE]
# It holds DIR/go open (a FIFO the test or benchmark holds open for writing), prints its
# values, writes one byte to DIR/started (the one who reads it counts the instances that
# started), then waits until DIR/go ends (every instance released at once) and ends 0; instance
# FAILING ends with exit code CODE instead, and the others then wait to be ended.
exec 3<"$1/go"
echo "values $POPDIST_INSTANCE_INDEX $POPDIST_LOCAL_INSTANCE_INDEX $POPDIST_NUM_LOCAL_INSTANCES" \
    "$POPDIST_NUM_LOCAL_REPLICAS $POPDIST_REPLICA_INDEX_OFFSET $POPDIST_HOST" \
    "${CUDA_VISIBLE_DEVICES-unset} $OMPI_COMM_WORLD_RANK"
printf x >"$1/started"
read -r _ <&3
if [ -n "$2" ]; then
    if [ "$POPDIST_INSTANCE_INDEX" = "$2" ]; then
        echo "instance $2 is failing on purpose" >&2
        exit "$3"
    fi
    exec sleep 60
fi
