"""The limits a rank starts with, decided from limits.conf as pam_limits decides a login's
(gpusession/launcher/limits.py): pure, on texts; the launcher applying them to a real rank of a
real account is in tests/hub/test_launcher_alone.py."""
from __future__ import annotations

from gpusession.launcher.limits import UNLIMITED, Rlimit, Who, limits_files_in_order, user_limits, with_current

NOFILE, CORE, STACK, CPU, NICE = 7, 4, 3, 0, 13
BOB = Who("bob", 1001, 1001, frozenset({1001, 2000}), frozenset({"bob", "gpu"}))


def _limits(*files: str, who: Who = BOB):
    return user_limits([(f"/etc/security/f{n}.conf", text) for n, text in enumerate(files)], who, nr_open=1048576)


def _by_item(found) -> dict[str, tuple[int, int]]:
    return {limit.item: (limit.soft, limit.hard) for limit in found.rlimits}


def test_a_users_own_entry_beats_a_group_entry_and_a_group_entry_beats_star_whatever_their_order():
    found = _limits("bob hard nofile 4000\n@gpu hard nofile 9000\n* hard nofile 100\n"
                    "* soft nofile 50\n@gpu soft nofile 60\n")
    assert _by_item(found)["nofile"] == (60, 4000)


def test_a_later_entry_of_the_same_kind_replaces_an_earlier_one_across_files_in_order():
    found = _limits("bob soft nofile 100\n", "bob soft nofile 200\n")
    assert _by_item(found)["nofile"] == (200, -1)  # the hard one is not set: the launcher's stays


def test_limits_d_files_are_read_after_limits_conf_by_file_name():
    assert limits_files_in_order("/etc/security/limits.conf", ["/d/90-b.conf", "/d/10-z.conf"]) == [
        "/etc/security/limits.conf", "/d/10-z.conf", "/d/90-b.conf"]
    assert limits_files_in_order(None, []) == []


def test_units_are_kilobytes_minutes_and_20_minus_nice_and_unlimited_nofile_is_nr_open():
    found = _limits("bob - stack 8192\nbob - cpu 2\nbob - nice -5\nbob - nofile unlimited\nbob hard core infinity\n")
    seen = _by_item(found)
    assert seen["stack"] == (8192 * 1024,) * 2
    assert seen["cpu"] == (120, 120)
    assert seen["nice"] == (25, 25)
    assert seen["nofile"] == (1048576, 1048576)
    assert seen["core"] == (-1, UNLIMITED)


def test_groups_match_by_name_or_gid_any_group_and_ranges_match_the_primary_gid_only():
    assert _by_item(_limits("@gpu - nofile 10\n"))["nofile"] == (10, 10)  # a supplementary group
    assert _by_item(_limits("@:2000 - nofile 11\n"))["nofile"] == (11, 11)
    assert _by_item(_limits("@1000:1001 - nofile 12\n"))["nofile"] == (12, 12)  # primary 1001
    assert _limits("@1500:2500 - nofile 13\n").rlimits == ()  # 2000 is supplementary, not primary
    assert _limits("@staff - nofile 14\n").rlimits == ()


def test_uid_ranges_count_as_the_users_own_entry():
    assert _by_item(_limits("1000:1005 hard nofile 20\n@gpu hard nofile 30\n"))["nofile"] == (-1, 20)
    assert _by_item(_limits(":1001 hard nofile 21\n"))["nofile"] == (-1, 21)
    assert _by_item(_limits("1001: hard nofile 22\n"))["nofile"] == (-1, 22)
    assert _limits("1002: hard nofile 23\n").rlimits == ()


def test_a_matching_no_limit_line_takes_away_every_limit_even_those_set_before_it():
    found = _limits("bob hard nofile 4000\n", "@gpu -\nbob soft core 0\n")
    assert found.rlimits == () and found.exempt == "/etc/security/f1.conf:1"
    assert _limits("@staff -\nbob hard nofile 5\n").rlimits  # not bob's group: read on


def test_maxlogins_0_says_no_login_naming_the_entry_and_a_positive_count_says_nothing():
    assert _limits("# a comment\n%gpu - maxlogins 0\n").no_login == "/etc/security/f0.conf:2"
    assert _limits("bob - maxlogins 0\n").no_login == "/etc/security/f0.conf:1"
    assert _limits("bob - maxlogins 0\nbob - maxlogins 4\n").no_login is None
    assert _limits("bob hard maxlogins 3\n").no_login is None


def test_a_percent_domain_sets_nothing_but_maxlogins():
    assert _limits("% hard nofile 5\n%gpu hard nofile 5\n").rlimits == ()


def test_priority_and_nonewprivs():
    found = _limits("bob - priority 10\n* - nonewprivs 1\n")
    assert found.priority == 10 and found.no_new_privs


def test_lines_pam_limits_cannot_read_are_skipped_naming_file_and_line_and_change_nothing():
    found = _limits("bob hard nofile\nbob often nofile 3\nbob hard wings 3\nbob hard nofile lots\n"
                    "a:b hard nofile 3\nbob hard nofile 7  # the one that counts\n")
    assert _by_item(found)["nofile"] == (-1, 7)
    assert [line.split(":")[1] for line in found.skipped] == ["1", "2", "3", "4", "5"]
    assert "unknown item 'wings'" in found.skipped[2] and "'lots'" in found.skipped[3]


def test_type_item_and_value_are_read_in_any_case():
    assert _by_item(_limits("bob HARD NoFile UNLIMITED\n"))["nofile"] == (-1, 1048576)


def test_a_soft_entry_blocked_by_a_more_specific_one_leaves_the_hard_one_too_as_pam_limits_does():
    found = _limits("bob soft nofile 10\n* - nofile 500\n")
    assert _by_item(found)["nofile"] == (10, -1)


def test_the_soft_limit_set_is_never_above_the_hard_one_and_unset_parts_keep_the_launchers():
    assert with_current(Rlimit(NOFILE, "nofile", 5000, 4000), (1024, 8192)) == (4000, 4000)
    assert with_current(Rlimit(NOFILE, "nofile", -1, 512), (1024, 8192)) == (512, 512)
    assert with_current(Rlimit(NOFILE, "nofile", 2048, -1), (1024, 8192)) == (2048, 8192)
    assert with_current(Rlimit(CORE, "core", -1, UNLIMITED), (0, 0)) == (0, UNLIMITED)
