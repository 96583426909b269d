package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/pgfence/pgfence/leases/tasks"
)

// A command is one verb of a noun (`pgfence leases show`), or a noun that is a
// command by itself (`pgfence doctor`, verb ""). Each lives in the file named
// after its noun.
type command struct {
	noun, verb string
	// args name the positional arguments, all required.
	args []string
	// usage is what follows the command's name in its usage line: its
	// arguments and the flags that matter most.
	usage   string
	summary string
	// database: the command takes --database-url and --connect-timeout.
	database bool
	// setup registers the command's own flags and returns the function that
	// runs it; the flag values are read when that function runs.
	setup func(fs *flag.FlagSet) runFunc
}

type runFunc func(ctx context.Context, in *input) error

// name is the command as typed: "leases show", "doctor".
func (c *command) name() string {
	if c.verb == "" {
		return c.noun
	}
	return c.noun + " " + c.verb
}

// usageLine is the command's usage, after "pgfence ".
func (c *command) usageLine() string {
	return strings.TrimSpace(c.name() + " " + c.usage)
}

// noun is a group of commands.
type noun struct {
	name    string
	summary string
}

// nouns lists the groups of commands in the order `pgfence help` shows them.
func nouns() []noun {
	return []noun{
		{"migrate", "install or upgrade the pgfence schema"},
		{"leases", "inspect leases and their grant history, follow one as it changes; force-release a stuck grant; pause new grants"},
		{"fences", "fenced resources: the highest accepted token of each, and the writes refused"},
		{"tables", "guard tables with a trigger, so that every write must present a current token"},
		{"floor", "the token floor: show it, or raise it after a restore or a schema rebuild"},
		{"keys", "idempotency keys: list and show their state, find and fail abandoned ones, delete expired ones"},
		{"tasks", "ordered tasks per key: list them and show one's status and result; retry or skip a failed one that blocks its key"},
		{"maintenance", "prune pgfence's tables inside the database: its pruning functions as pg_cron jobs"},
		{"ui", "a web console over leases, fences, idempotency keys and elections; read-only unless --allow-actions"},
		{"doctor", "check a database: role, schema and who owns it, pgfence roles, migration lock, durability, timeouts, pooler, leases, protected tables, ordered tasks, pruning"},
		{"demo", "watch the database reject a paused lock holder's late write (a throwaway database by default)"},
		{"bench", "measure leases, fenced writes and idempotency against raw SQL, advisory locks and Redis"},
	}
}

// commands lists every command, grouped by noun in the order of nouns.
func commands() []*command {
	return []*command{
		{noun: "migrate", verb: "up", database: true, setup: migrateUp,
			summary: "apply every pending migration (safe to run from several processes at once)"},
		{noun: "migrate", verb: "down", usage: "[--to VERSION]", database: true, setup: migrateDown,
			summary: "roll back the newest migration, or down to --to VERSION (0 rolls back all; the empty schema pgfence, its version table and the cluster-wide roles remain)"},
		{noun: "migrate", verb: "status", database: true, setup: migrateStatus,
			summary: "list the migrations and whether each is applied"},
		{noun: "migrate", verb: "sql", usage: "[--direction up|down] [--from VERSION] [--to VERSION]", setup: migrateSQL,
			summary: "print the plain SQL for other migration tools or psql; it records its steps as up and down do; needs no database"},

		{noun: "leases", verb: "list", database: true, setup: leasesList,
			summary: "every lease with its remaining time (database clock), and the paused prefixes"},
		{noun: "leases", verb: "show", args: []string{"KEY"}, usage: "KEY [--history N]", database: true, setup: leasesShow,
			summary: "one lease and its recent grant history"},
		{noun: "leases", verb: "watch", args: []string{"KEY"}, usage: "KEY [--history N] [--count N] [--poll 5s] [--no-wakeups]", database: true, setup: leasesWatch,
			summary: "follow one lease: every grant, takeover, release and holder info change (who, token, when by the database clock), as it happens; --json prints one object per line"},
		{noun: "leases", verb: "release", args: []string{"KEY"}, usage: "KEY --force --reason TEXT", database: true, setup: leasesRelease,
			summary: "end the current grant whoever holds it (recorded in the history)"},
		{noun: "leases", verb: "pause", args: []string{"PREFIX"}, usage: "PREFIX --reason TEXT", database: true, setup: leasesPause,
			summary: "kill switch: refuse new grants of keys starting with PREFIX ('' = every key); current holders keep renewing, writing and releasing"},
		{noun: "leases", verb: "resume", args: []string{"PREFIX"}, usage: "PREFIX [--reason TEXT]", database: true, setup: leasesResume,
			summary: "lift the pause of exactly PREFIX"},

		{noun: "fences", verb: "list", usage: "[--prefix TEXT] [--limit N]", database: true, setup: fencesList,
			summary: "the fenced resources with their highest accepted token"},
		{noun: "fences", verb: "show", args: []string{"RESOURCE"}, usage: "RESOURCE [--rejections N]", database: true, setup: fencesShow,
			summary: "one fenced resource and its recent rejected writes"},

		{noun: "tables", verb: "list", database: true, setup: tablesList,
			summary: "the protected tables and the resource of their rows"},
		{noun: "tables", verb: "protect", args: []string{"TABLE"}, usage: "TABLE --resource-column COLUMN [--prefix TEXT]", database: true, setup: tablesProtect,
			summary: "guard TABLE with a trigger: every INSERT, UPDATE and DELETE must present an accepted token for its row's resource"},
		{noun: "tables", verb: "unprotect", args: []string{"TABLE"}, usage: "TABLE", database: true, setup: tablesUnprotect,
			summary: "remove the guard from TABLE"},

		{noun: "floor", verb: "show", usage: "[--column schema.table.column ...]", database: true, setup: floorShow,
			summary: "the token floor and the highest token stored in pgfence's tables (and in --column columns)"},
		{noun: "floor", verb: "raise", usage: "--reason TEXT [--to N] [--column schema.table.column ...]", database: true, setup: floorRaise,
			summary: "make every future token greater than --to (default: the highest stored token); never lowers it"},

		{noun: "keys", verb: "list", args: []string{"SCOPE"}, usage: "SCOPE [--limit N]", database: true, setup: keysList,
			summary: "the state of a scope's keys, newest first, with the trace id of the claim that owns each"},
		{noun: "keys", verb: "show", args: []string{"SCOPE", "KEY"}, usage: "SCOPE KEY", database: true, setup: keysShow,
			summary: "the state of one key"},
		{noun: "keys", verb: "gc", usage: "[--batch-size N] [--max-batches N]", database: true, setup: keysGC,
			summary: "delete completed keys whose retention ended, in batches; keys in flight are never touched"},
		{noun: "keys", verb: "abandoned", usage: "[--scope-prefix P] [--expired-for D] [--limit N]", database: true, setup: keysAbandoned,
			summary: "leased keys left in progress after their lease ended, oldest first: what a completer would take over"},
		{noun: "keys", verb: "fail-abandoned", usage: "[--scope-prefix P] [--expired-for D] [--limit N]", database: true, setup: keysFailAbandoned,
			summary: "take abandoned keys over and store a failure (code \"abandoned\") a retry replays; to resume them instead, use idempotency.Store.Recover"},

		{noun: "tasks", verb: "list", usage: "[--key K | --prefix P] [--state S] [--limit N] [--after ID]", database: true, setup: tasksList,
			summary: "the ordered tasks this role may see, by id (enqueue order), with their state, number and attempts; --after continues a page"},
		{noun: "tasks", verb: "show", args: []string{"ID"}, usage: "ID", database: true, setup: tasksShow,
			summary: "one task: its state, number, attempts, timestamps, payload, and its result or error"},
		{noun: "tasks", verb: "retry", args: []string{"ID"}, usage: "ID --reason TEXT", database: true, setup: taskAction("retried", "task_retry", tasks.StatePending),
			summary: "make a failed task pending again with its attempts reset, and unblock its key"},
		{noun: "tasks", verb: "skip", args: []string{"ID"}, usage: "ID --reason TEXT", database: true, setup: taskAction("skipped", "task_skip", tasks.StateSkipped),
			summary: "mark a failed task skipped (never applied), and unblock its key: the key's later tasks go on"},

		{noun: "maintenance", verb: "schedule", usage: "[--dry-run] [--target-database NAME] [--schedule CRON] [--batch-size N]", database: true, setup: maintenanceSchedule,
			summary: "schedule prune_lease_events, prune_fence_rejections, advance_retention, prune_retired, idempotency_gc and prune_tasks as pg_cron jobs (connect to cron.database_name); --dry-run prints the SQL"},

		{noun: "ui", usage: "[--addr 127.0.0.1:8089] [--access-token TOKEN] [--allow-actions] [--refresh 5s]", database: true, setup: ui,
			summary: "serve a web console: holders, waiters, pauses, rejections, abandoned keys, the doctor, each key's timeline; read-only unless --allow-actions"},

		{noun: "doctor", database: true, setup: doctor,
			summary: "check a database: role, schema and who owns it, pgfence roles, migration lock, durability, timeouts, pooler, leases, protected tables, ordered tasks, pruning"},

		{noun: "demo", usage: "[--ttl 1s] [--keep]", database: true, setup: runDemo,
			summary: "watch the database reject a paused lock holder's late write; without --database-url or DATABASE_URL it runs on a throwaway local PostgreSQL"},

		{noun: "bench", verb: "compare", usage: "[--cases a,b] [--workers 1,8] [--duration 3s] [--rounds 1] [--peers redis|none] [--rtt 0]", database: true, setup: benchCompare,
			summary: "measure leases, fenced writes and idempotency side by side with raw SQL, advisory locks and Redis"},
		{noun: "bench", verb: "curves", usage: "[--curves retention,rows,keys,resources,waiters,churn,failover,followers] [--workers 4] [--duration 2s] [--max-rows 1e5] [--one-off 1e5] ...", database: true, setup: benchCurves,
			summary: "measure how the cost grows with lease rows, stored keys, resources and waiters, what churn leaves in the leases table, an election's failover time and its idle followers' load"},
		{noun: "bench", verb: "contention", usage: "[--workers 16] [--keys 4] [--duration 10s] [--ttl 500ms] [--pause-rate 0.05] [--pause 2s] [--max-wait 1s]", database: true, setup: benchContention,
			summary: "capacity report: workers contend for hot keys, each grant a fenced business write; acquisitions, waits, give-ups, renewals, expiries and rejections beside the completions read back, reconciled (exit 1 if not)"},
	}
}

// lookup finds the command that args start with and returns it with the
// rest of args. An error says what is missing or unknown; flag.ErrHelp asks
// for a noun's help (printed already).
func lookup(e *env, args []string) (*command, []string, error) {
	all := commands()
	var verbs []*command
	for _, c := range all {
		if c.noun == args[0] {
			verbs = append(verbs, c)
		}
	}
	switch {
	case len(verbs) == 0:
		return nil, nil, &cliError{msg: fmt.Sprintf("unknown command %q", args[0]), hint: "run `pgfence help` for the list of commands", code: exitUsage}
	case verbs[0].verb == "":
		return verbs[0], args[1:], nil
	}
	names := verbNames(verbs)
	want := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	if len(args) == 1 || slices.Contains([]string{"help", "-h", "--help"}, args[1]) {
		nounUsage(e.stderr, verbs)
		if len(args) == 1 {
			return nil, nil, usageError("%s needs a subcommand: %s", args[0], want)
		}
		return nil, nil, flag.ErrHelp
	}
	i := slices.Index(names, args[1])
	if i < 0 {
		return nil, nil, usageError("%s: unknown subcommand %q (want %s)", args[0], args[1], want)
	}
	return verbs[i], args[2:], nil
}

// nounUsage lists a noun's commands.
func nounUsage(w io.Writer, verbs []*command) {
	fmt.Fprintf(w, "Usage: pgfence %s <%s> [arguments] [flags]\n\n", verbs[0].noun, strings.Join(verbNames(verbs), "|"))
	for _, c := range verbs {
		fmt.Fprintf(w, "  pgfence %s\n      %s\n", c.usageLine(), c.summary)
	}
	fmt.Fprintf(w, "\nRun `pgfence %s <command> -h` for its flags.\n", verbs[0].noun)
}

func verbNames(verbs []*command) []string {
	names := make([]string, len(verbs))
	for i, c := range verbs {
		names[i] = c.verb
	}
	return names
}

// runCommand parses c's flags and arguments and runs it.
func runCommand(ctx context.Context, e *env, c *command, args []string) error {
	fs := newFlags(e, c.name(), c.usageLine()+" [flags]", c.summary)
	in := &input{env: e}
	if c.database {
		in.db.register(fs)
	}
	fs.BoolVar(&in.json, "json", false, "print one JSON object instead of text")
	run := c.setup(fs)
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() != len(c.args) {
		switch len(c.args) {
		case 0:
			return usageError("%s takes no arguments, got %q", c.name(), fs.Args())
		case 1:
			return usageError("%s needs exactly one %s, got %d arguments", c.name(), c.args[0], fs.NArg())
		default:
			return usageError("%s needs %s, got %d arguments", c.name(), strings.Join(c.args, " and "), fs.NArg())
		}
	}
	in.args = fs.Args()
	return run(ctx, in)
}
