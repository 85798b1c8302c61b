package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// cronField describes one field of a cron expression.
type cronField struct {
	name     string
	min, max int
	names    map[string]int
}

var cronFields = [5]cronField{
	{name: "minute", min: 0, max: 59},
	{name: "hour", min: 0, max: 23},
	{name: "day-of-month", min: 1, max: 31},
	{name: "month", min: 1, max: 12, names: map[string]int{
		"JAN": 1, "FEB": 2, "MAR": 3, "APR": 4, "MAY": 5, "JUN": 6,
		"JUL": 7, "AUG": 8, "SEP": 9, "OCT": 10, "NOV": 11, "DEC": 12,
	}},
	{name: "day-of-week", min: 0, max: 6, names: map[string]int{
		"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6,
	}},
}

// cronDescriptors are the shorthands gocron accepts besides five fields.
var cronDescriptors = map[string]bool{
	"@yearly": true, "@annually": true, "@monthly": true, "@weekly": true,
	"@daily": true, "@midnight": true, "@hourly": true,
}

// checkCron reports whether expr is a standard five-field cron expression
// (minute hour day-of-month month day-of-week) or one of the descriptors
// @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly. Each
// field is a comma-separated list of *, N, N-M, */S, N/S or N-M/S; months and
// weekdays may be written as JAN..DEC and SUN..SAT, in any case.
func checkCron(expr string) error {
	if strings.HasPrefix(expr, "@") {
		switch {
		case cronDescriptors[expr]:
			return nil
		case strings.HasPrefix(expr, "@every"):
			return errors.New("@every is not supported here: use every: instead of cron:")
		}
		return fmt.Errorf("unknown descriptor %q", expr)
	}
	fields := strings.Fields(expr)
	if len(fields) != 5 {
		return fmt.Errorf("want 5 fields (minute hour day-of-month month day-of-week), got %d in %q", len(fields), expr)
	}
	for i, f := range fields {
		if err := cronFields[i].check(f); err != nil {
			return fmt.Errorf("%s field %q: %w", cronFields[i].name, f, err)
		}
	}
	return nil
}

// check validates one field.
func (cf cronField) check(field string) error {
	for _, part := range strings.Split(field, ",") {
		rng, step, hasStep := strings.Cut(part, "/")
		if hasStep {
			if n, err := cf.number(step); err != nil || n < 1 {
				return fmt.Errorf("bad step %q", step)
			}
		}
		if rng == "*" {
			continue
		}
		lo, hi, isRange := strings.Cut(rng, "-")
		a, err := cf.value(lo)
		if err != nil {
			return err
		}
		if !isRange {
			continue
		}
		b, err := cf.value(hi)
		if err != nil {
			return err
		}
		if a > b {
			return fmt.Errorf("range %s-%s goes backwards", lo, hi)
		}
	}
	return nil
}

// value parses a number or name within the field's range.
func (cf cronField) value(s string) (int, error) {
	if n, ok := cf.names[strings.ToUpper(s)]; ok {
		return n, nil
	}
	n, err := cf.number(s)
	if err != nil {
		return 0, fmt.Errorf("bad value %q", s)
	}
	if n < cf.min || n > cf.max {
		return 0, fmt.Errorf("%d is out of range %d-%d", n, cf.min, cf.max)
	}
	return n, nil
}

// number parses an unsigned decimal number.
func (cronField) number(s string) (int, error) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, errors.New("not a number")
	}
	return strconv.Atoi(s)
}
