-- The equal-work PostgreSQL peer: what sharecoord does per write, as PL/pgSQL.
--
-- One row per share-partition holds the state sharecoord keeps for a key
-- (docs/semantics.md §2). A write loads the row FOR UPDATE, fences, merges the new
-- batches into the stored ones with Kafka's combiner (§7) and stores the result, all in
-- the caller's transaction (one statement: autocommit, synchronous_commit on).
--
-- Batches travel and rest as one flat bigint[]: first, last, state, count for each
-- batch, in that order. PL/pgSQL reads elements of a fixed-width array in place, while a
-- composite-type array would rebuild a row for every element it touches, and the client
-- sends one plain array literal per parameter instead of quoted row literals.
--
-- @RECORDS_PER_SNAPSHOT@ is sharecoord's snapshot cadence (§6), substituted on install.
-- Which of a snapshot or an update a write becomes changes how its batches merge when it
-- carries several (§A.1 point 14), so the peer counts updates as sharecoord's replay does.

DROP TABLE IF EXISTS share_partition_state;
CREATE TABLE share_partition_state (
    group_id text NOT NULL,
    topic_id text NOT NULL,
    partition int NOT NULL,
    snapshot_epoch int NOT NULL,
    state_epoch int NOT NULL,
    leader_epoch int NOT NULL,
    start_offset bigint NOT NULL,
    delivery_complete_count int NOT NULL,
    leader_fence int NOT NULL,
    state_fence int,        -- null: a key never snapshotted (not reachable from here)
    update_count int,       -- null: no update since the key was created (§4.7 step 4)
    state_batches bigint[] NOT NULL,
    PRIMARY KEY (group_id, topic_id, partition)
);

-- docs/semantics.md §7, step for step: prune, short cut, sorted set, walk to the first
-- mergeable pair, resolve it, repeat. `remaining` is the set in (first, last, count,
-- state) order; `final` what the walk has passed over.
CREATE OR REPLACE FUNCTION share_combine_batches(
    current_batches bigint[], new_batches bigint[], start_offset bigint
) RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    all_batches bigint[] := current_batches || new_batches;
    kept bigint[];
    remaining bigint[] := '{}';
    final bigint[] := '{}';
    pieces bigint[];
    n int;
    pos int;
    steps int := 0;
    f bigint; l bigint; s bigint; c bigint;
    pf bigint; pl bigint; ps bigint; pc bigint;
    cf bigint; cl bigint; cs bigint; cc bigint;
    cand_higher boolean;
BEGIN
    -- Step 2: -1 means no pruning.
    IF start_offset <> -1 THEN
        kept := '{}';
        FOR i IN 0 .. cardinality(all_batches) / 4 - 1 LOOP
            l := all_batches[4 * i + 2];
            CONTINUE WHEN l < start_offset;
            kept := kept || ARRAY[greatest(all_batches[4 * i + 1], start_offset), l,
                                  all_batches[4 * i + 3], all_batches[4 * i + 4]];
        END LOOP;
        all_batches := kept;
    END IF;
    -- Step 3: fewer than two batches come back as they are, unsorted and unchecked.
    IF cardinality(all_batches) < 8 THEN
        RETURN all_batches;
    END IF;
    pieces := all_batches;
    LOOP
        -- Step 4, and step 6's re-insertion: into the set, an identical batch only once.
        FOR i IN 0 .. cardinality(pieces) / 4 - 1 LOOP
            f := pieces[4 * i + 1]; l := pieces[4 * i + 2];
            s := pieces[4 * i + 3]; c := pieces[4 * i + 4];
            n := cardinality(remaining) / 4;
            pos := 0;
            WHILE pos < n AND (remaining[4 * pos + 1], remaining[4 * pos + 2],
                               remaining[4 * pos + 4], remaining[4 * pos + 3]) < (f, l, c, s) LOOP
                pos := pos + 1;
            END LOOP;
            CONTINUE WHEN pos < n AND remaining[4 * pos + 1] = f AND remaining[4 * pos + 2] = l
                          AND remaining[4 * pos + 3] = s AND remaining[4 * pos + 4] = c;
            remaining := remaining[1 : 4 * pos] || ARRAY[f, l, s, c] || remaining[4 * pos + 1 :];
        END LOOP;
        -- Step 5: every prev that does not pair with its successor is final.
        LOOP
            EXIT WHEN cardinality(remaining) < 8;
            pf := remaining[1]; pl := remaining[2]; ps := remaining[3]; pc := remaining[4];
            cf := remaining[5]; cl := remaining[6]; cs := remaining[7]; cc := remaining[8];
            EXIT WHEN cf <= pl OR (cf = pl + 1 AND cc = pc AND cs = ps);
            final := final || remaining[1 : 4];
            remaining := remaining[5 :];
        END LOOP;
        IF cardinality(remaining) < 8 THEN
            RETURN final || remaining;
        END IF;
        -- Step 6: the pair leaves the set, its pieces go back in.
        remaining := remaining[9 :];
        IF pc = cc AND ps = cs THEN
            pieces := ARRAY[pf, greatest(pl, cl), ps, pc];
        ELSE
            cand_higher := cc > pc OR (cc = pc AND cs > ps);
            IF cf = pf THEN
                IF cl = pl OR cand_higher THEN
                    pieces := ARRAY[cf, cl, cs, cc];
                ELSE
                    pieces := ARRAY[pf, pl, ps, pc, pl + 1, cl, cs, cc];
                END IF;
            ELSIF NOT cand_higher THEN
                IF cl <= pl THEN
                    pieces := ARRAY[pf, pl, ps, pc];
                ELSE
                    pieces := ARRAY[pf, pl, ps, pc, pl + 1, cl, cs, cc];
                END IF;
            ELSIF cl < pl THEN
                pieces := ARRAY[pf, cf - 1, ps, pc, cf, cl, cs, cc, cl + 1, pl, ps, pc];
            ELSE
                pieces := ARRAY[pf, cf - 1, ps, pc, cf, cl, cs, cc];
            END IF;
        END IF;
        -- Kafka's walk never ends on some inverted input (first > last); sharecoord
        -- refuses it (§A.1 point 15), and so does this, by counting.
        steps := steps + 1;
        IF steps > 100000 THEN
            RAISE EXCEPTION 'share_combine_batches: inverted batches make the merge cycle';
        END IF;
    END LOOP;
END
$$;

-- docs/semantics.md §5.3 and §6: fence, then one snapshot or one update, applied as
-- sharecoord's replay applies it (§4). Returns the entry's error code.
CREATE OR REPLACE FUNCTION write_share_state(
    p_group_id text, p_topic_id text, p_partition int, p_state_epoch int,
    p_leader_epoch int, p_start_offset bigint, p_delivery_complete_count int,
    p_state_batches bigint[]
) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    st share_partition_state%ROWTYPE;
    new_start bigint;
    merged bigint[];
BEGIN
    SELECT * INTO st FROM share_partition_state
     WHERE group_id = p_group_id AND topic_id = p_topic_id AND partition = p_partition
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 42;
    END IF;
    IF p_leader_epoch <> -1 AND st.leader_fence > p_leader_epoch THEN
        RETURN 74;
    END IF;
    IF p_state_epoch <> -1 AND st.state_fence > p_state_epoch THEN
        RETURN 124;
    END IF;
    new_start := CASE WHEN p_start_offset = -1 THEN st.start_offset ELSE p_start_offset END;
    IF coalesce(st.update_count, 0) >= @RECORDS_PER_SNAPSHOT@ THEN
        -- A snapshot: stored and new batches merged in one pass; it resets a counter
        -- that reached the limit (§4.4).
        merged := share_combine_batches(st.state_batches, p_state_batches, new_start);
        st.snapshot_epoch := st.snapshot_epoch + 1;
        IF st.update_count IS NOT NULL THEN
            st.update_count := 0;
        END IF;
    ELSE
        -- An update carries the new batches merged among themselves at the request's
        -- start offset; replay merges that into the stored ones (§4.7).
        merged := share_combine_batches(
            st.state_batches, share_combine_batches('{}', p_state_batches, p_start_offset),
            new_start);
        st.update_count := coalesce(st.update_count + 1, 0);
    END IF;
    UPDATE share_partition_state
       SET snapshot_epoch = st.snapshot_epoch,
           start_offset = new_start,
           delivery_complete_count = CASE WHEN p_delivery_complete_count = -1
                                          THEN st.delivery_complete_count
                                          ELSE p_delivery_complete_count END,
           update_count = st.update_count,
           state_batches = merged
     WHERE group_id = p_group_id AND topic_id = p_topic_id AND partition = p_partition;
    RETURN 0;
END
$$;

-- Many share-partitions of one group in one call, hence one transaction and one commit.
-- p_batch_counts[i] says how many batches of p_state_batches belong to entry i.
CREATE OR REPLACE FUNCTION write_share_states(
    p_group_id text, p_topic_id text, p_partitions int[], p_state_epochs int[],
    p_leader_epochs int[], p_start_offsets bigint[], p_delivery_complete_counts int[],
    p_batch_counts int[], p_state_batches bigint[]
) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    codes int[] := '{}';
    at int := 1;
    width int;
BEGIN
    -- Lock the rows in one order first: two concurrent calls over overlapping
    -- partitions then queue instead of deadlocking over their request orders.
    PERFORM 1 FROM share_partition_state
      WHERE group_id = p_group_id AND topic_id = p_topic_id AND partition = ANY (p_partitions)
      ORDER BY partition FOR UPDATE;
    FOR i IN 1 .. cardinality(p_partitions) LOOP
        width := 4 * p_batch_counts[i];
        codes := codes || write_share_state(
            p_group_id, p_topic_id, p_partitions[i], p_state_epochs[i], p_leader_epochs[i],
            p_start_offsets[i], p_delivery_complete_counts[i],
            p_state_batches[at : at + width - 1]);
        at := at + width;
    END LOOP;
    RETURN codes;
END
$$;

-- docs/semantics.md §5.1: fence the state epoch (-1 skips), then a fresh snapshot.
CREATE OR REPLACE FUNCTION initialize_share_state(
    p_group_id text, p_topic_id text, p_partition int, p_state_epoch int,
    p_start_offset bigint
) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    st share_partition_state%ROWTYPE;
BEGIN
    SELECT * INTO st FROM share_partition_state
     WHERE group_id = p_group_id AND topic_id = p_topic_id AND partition = p_partition
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO share_partition_state VALUES (
            p_group_id, p_topic_id, p_partition, 0, p_state_epoch, 0, p_start_offset,
            CASE WHEN p_start_offset = -1 THEN -1 ELSE 0 END, 0, p_state_epoch, NULL, '{}');
        RETURN 0;
    END IF;
    IF p_state_epoch <> -1 AND st.state_fence > p_state_epoch THEN
        RETURN 124;
    END IF;
    UPDATE share_partition_state
       SET snapshot_epoch = st.snapshot_epoch + 1,
           state_epoch = p_state_epoch,
           leader_epoch = 0,
           start_offset = p_start_offset,
           delivery_complete_count = CASE WHEN p_start_offset = -1 THEN -1 ELSE 0 END,
           leader_fence = greatest(st.leader_fence, 0),
           state_fence = greatest(st.state_fence, p_state_epoch),
           update_count = CASE WHEN st.update_count >= @RECORDS_PER_SNAPSHOT@ THEN 0
                               ELSE st.update_count END,
           state_batches = '{}'
     WHERE group_id = p_group_id AND topic_id = p_topic_id AND partition = p_partition;
    RETURN 0;
END
$$;
